"""Varlen causal paged prefill attention vs its torch reference."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.paged_prefill_attention import (
    paged_prefill_attention,
    paged_prefill_attention_ref,
)
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu, make_paged_kv, start_loc


def _check(query_lens: list[int], seq_lens: list[int], hq: int, hkv: int, d: int,
           dtype: torch.dtype, first_req: int = 0, **kw: object) -> None:
    """Runs the kernel on requests [first_req, R) of the batch, as the backend does after the
    decode rows, and checks that it writes exactly those rows."""
    kv = make_paged_kv(seq_lens, hkv, d, dtype)
    qsl = start_loc(query_lens)
    T = int(qsl[-1])
    qkv = torch.randn(T, hq + 2 * hkv, d, device=DEVICE).to(dtype)
    q = qkv[:, :hq]  # strided, as the model's fused projection gives it
    out = torch.full_like(q, float("nan"))
    base = int(qsl[first_req])
    paged_prefill_attention(
        q, kv.layer, kv.block_tables[first_req:], kv.seq_lens[first_req:], qsl[first_req:],
        d**-0.5, num_tokens=T - base, q_base=base, out=out, **kw,  # type: ignore[arg-type]
    )
    ref = paged_prefill_attention_ref(q, kv.layer, kv.block_tables, kv.seq_lens, qsl, d**-0.5)
    assert torch.isnan(out[:base]).all(), "wrote rows of requests it was not given"
    assert_close(out[base:], ref[base:], dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (2, 2, 64), (8, 1, 128)])
def test_prefill_mixed_batch(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    # decode rows, a chunk after a cached prefix, a fresh prompt, a chunk ending mid-page
    query_lens = [1, 1, 20, 37, 5]
    seq_lens = [7, 40, 50, 37, 60]
    _check(query_lens, seq_lens, hq, hkv, d, dtype)


@pytest.mark.parametrize("first_req", [1, 2])
def test_prefill_after_decode_rows(first_req: int) -> None:
    _check([1, 1, 19, 3, 33], [9, 17, 19, 64, 50], 4, 2, 64, torch.float32, first_req=first_req)


@pytest.mark.parametrize("block_m,block_n", [(16, 16), (32, 64), (64, 64)])
def test_prefill_tile_shapes(block_m: int, block_n: int) -> None:
    _check([1, 40, 17], [33, 40, 90], 4, 2, 64, torch.float32, block_m=block_m, block_n=block_n)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (40, 40, 128), (16, 2, 64), (12, 4, 80)])
@gpu
def test_prefill_gpu(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    query_lens = [1, 1, 1, 700, 1, 2048, 300, 129]
    seq_lens = [900, 1, 3000, 700, 17, 4000, 300, 1500]
    for first_req in (0, 3):
        _check(query_lens, seq_lens, hq, hkv, d, dtype, first_req=first_req)
