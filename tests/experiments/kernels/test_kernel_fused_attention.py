"""Horizontally fused prefill + decode attention vs the two torch references."""

from __future__ import annotations

import pytest
import torch

from benchmarks.experiments.kernels.fused_attention import (
    DecodeProblem,
    PrefillProblem,
    fused_paged_attention,
    fused_paged_attention_ref,
    split_programs,
)
from kvtier.kernels.paged_decode_attention import DenseSegment
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu, make_paged_kv, start_loc


def _prefill(query_lens: list[int], seq_lens: list[int], hq: int, hkv: int, d: int,
             dtype: torch.dtype, layers_per_block: int = 2, slot: int = 0) -> PrefillProblem:
    kv = make_paged_kv(seq_lens, hkv, d, dtype, layers_per_block=layers_per_block, slot=slot)
    qsl = start_loc(query_lens)
    qkv = torch.randn(int(qsl[-1]), hq + 2 * hkv, d, device=DEVICE).to(dtype)
    return PrefillProblem(qkv[:, :hq], kv.layer, kv.block_tables, kv.seq_lens, qsl)


def _decode(seq_lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype,
            prefix_lens: list[int] | None = None, layers_per_block: int = 2, slot: int = 1,
            num_splits: int | None = None) -> DecodeProblem:
    kv = make_paged_kv(seq_lens, hkv, d, dtype, layers_per_block=layers_per_block, slot=slot)
    qkv = torch.randn(len(seq_lens), hq + 2 * hkv, d, device=DEVICE).to(dtype)
    prefix = None
    if prefix_lens is not None:
        rows = sum(prefix_lens)
        prefix = DenseSegment(torch.randn(rows, hkv, d, device=DEVICE).to(dtype),
                              torch.randn(rows, hkv, d, device=DEVICE).to(dtype),
                              start_loc(prefix_lens))
    return DecodeProblem(qkv[:, :hq], kv.layer, kv.block_tables, kv.seq_lens, prefix=prefix,
                         num_splits=num_splits)


def _check(prefill: PrefillProblem | None, decode: DecodeProblem | None, d: int,
           **kw: object) -> None:
    p_out, d_out, split = fused_paged_attention(prefill, decode, d**-0.5, **kw)  # type: ignore[arg-type]
    p_ref, d_ref = fused_paged_attention_ref(prefill, decode, d**-0.5)
    if prefill is not None:
        assert p_out is not None and p_ref is not None and split.prefill_programs > 0
        assert_close(p_out, p_ref)
    else:
        assert p_out is None and split.prefill_programs == 0
    if decode is not None:
        assert d_out is not None and d_ref is not None and split.decode_programs > 0
        assert_close(d_out, d_ref)
    else:
        assert d_out is None and split.decode_programs == 0


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (2, 2, 64), (8, 1, 128)])
def test_fused_both_parts(dtype: torch.dtype, hq: int, hkv: int, d: int,
                          persistent: bool) -> None:
    # Different pools and layer views (F=4 slot 2 vs F=2 slot 1): strides and bases differ.
    prefill = _prefill([1, 20, 37, 5], [7, 50, 37, 60], hq, hkv, d, dtype,
                       layers_per_block=4, slot=2)
    decode = _decode([1, 16, 70, 33], hq, hkv, d, dtype, prefix_lens=[0, 5, 37, 0])
    _check(prefill, decode, d, persistent=persistent)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_prefill_only(dtype: torch.dtype, persistent: bool) -> None:
    _check(_prefill([3, 40, 17], [33, 40, 90], 4, 2, 64, dtype), None, 64,
           persistent=persistent)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_decode_only(dtype: torch.dtype, persistent: bool) -> None:
    _check(None, _decode([20, 9, 75, 40], 4, 2, 64, dtype), 64, persistent=persistent)


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.parametrize("num_splits", [None, 3])
def test_fused_decode_splits_and_reduce(num_splits: int | None, persistent: bool) -> None:
    # One request x 2 heads < the decode programs: the default cuts each context in splits.
    decode = _decode([600], 4, 2, 64, torch.float32, num_splits=num_splits)
    prefill = _prefill([9], [30], 4, 2, 64, torch.float32)
    p_out, d_out, split = fused_paged_attention(prefill, decode, 0.125, persistent=persistent)
    assert split.decode_splits == (num_splits or 3)  # cdiv(600, 256) caps the default
    p_ref, d_ref = fused_paged_attention_ref(prefill, decode, 0.125)
    assert_close(d_out, d_ref)  # type: ignore[arg-type]
    assert_close(p_out, p_ref)  # type: ignore[arg-type]


@pytest.mark.parametrize("num_programs,prefill_programs", [(2, 1), (3, 2), (16, None)])
def test_fused_program_counts(num_programs: int, prefill_programs: int | None) -> None:
    """Few programs: each loops over many work items of its part."""
    prefill = _prefill([1, 20, 37], [7, 50, 37], 4, 2, 64, torch.float32)
    decode = _decode([1, 16, 70, 33, 5], 4, 2, 64, torch.float32)
    _check(prefill, decode, 64, persistent=True, num_programs=num_programs,
           prefill_programs=prefill_programs)


def test_fused_mixed_step_same_layer() -> None:
    """The backend's use: decode rows then prefill rows of one q, one out, one layer view."""
    query_lens, seq_lens = [1, 1, 1, 20, 7], [9, 33, 17, 20, 40]
    nd, hq, hkv, d = 3, 4, 2, 64
    kv = make_paged_kv(seq_lens, hkv, d, torch.float32)
    qsl = start_loc(query_lens)
    q = torch.randn(int(qsl[-1]), hq, d, device=DEVICE)
    out = torch.full_like(q, float("nan"))
    decode = DecodeProblem(q[:nd], kv.layer, kv.block_tables[:nd], kv.seq_lens[:nd],
                           out=out[:nd], max_seq_len=max(seq_lens))
    prefill = PrefillProblem(q, kv.layer, kv.block_tables[nd:], kv.seq_lens[nd:], qsl[nd:],
                             out=out, num_tokens=int(qsl[-1]) - nd, q_base=nd)
    _, _, split = fused_paged_attention(prefill, decode, d**-0.5)
    assert (split.prefill_programs, split.decode_programs) == (split.prefill_work, 3 * 2)
    p_ref, d_ref = fused_paged_attention_ref(prefill, decode, d**-0.5)
    assert p_ref is not None and d_ref is not None
    assert_close(out[:nd], d_ref)
    assert_close(out[nd:], p_ref[nd:])


def test_split_programs_follows_the_time_ratio() -> None:
    assert split_programs(3.0, 1.0, 264, 10**4, 10**4) == (198, 66)
    assert split_programs(1e-9, 1.0, 264, 10**4, 10**4) == (1, 263)  # both parts get one
    assert split_programs(1.0, 1.0, 264, 50, 10**4) == (50, 214)  # no idle prefill programs
    assert split_programs(0.0, 1.0, 264, 0, 100) == (0, 100)
    assert split_programs(1.0, 0.0, 264, 500, 0) == (264, 0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (40, 40, 128), (16, 2, 64)])
@gpu
def test_fused_gpu(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    g = torch.Generator().manual_seed(hq * d)
    dec_lens = torch.randint(1, 3000, (40,), generator=g).tolist() + [1, 16, 4096]
    prefix = torch.randint(0, 64, (len(dec_lens),), generator=g).tolist()
    prefix = [min(p, s - 1) for p, s in zip(prefix, dec_lens)]
    decode = _decode(dec_lens, hq, hkv, d, dtype, prefix_lens=prefix, slot=1)
    q_lens = [1, 512, 64, 300, 129, 1]
    ctx = [900, 0, 2000, 0, 1371, 16]
    prefill = _prefill(q_lens, [c + n for c, n in zip(ctx, q_lens)], hq, hkv, d, dtype,
                       layers_per_block=4, slot=3)
    for persistent in (False, True):
        _check(prefill, decode, d, persistent=persistent)
        _check(prefill, None, d, persistent=persistent)
        _check(None, decode, d, persistent=persistent)
