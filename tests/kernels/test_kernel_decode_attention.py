"""Split-K paged decode attention vs its torch reference."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.paged_decode_attention import (
    DenseSegment,
    paged_decode_attention,
    paged_decode_attention_ref,
)
from kvtier.kernels.paged_decode_launch import (
    LARGE_PROGRAMS_TILES,
    MANY_PROGRAMS_TILES,
    DecodeTiles,
    default_min_split_tokens,
    default_num_splits,
    default_tiles,
)
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu, make_paged_kv, start_loc


def _check(seq_lens: list[int], hq: int, hkv: int, d: int, dtype: torch.dtype,
           prefix_lens: list[int] | None = None, **kw: object) -> None:
    kv = make_paged_kv(seq_lens, hkv, d, dtype)
    B = len(seq_lens)
    # q as a strided view of a fused qkv projection output, as the model produces it.
    qkv = torch.randn(B, hq + 2 * hkv, d, device=DEVICE).to(dtype)
    q = qkv[:, :hq]
    prefix = None
    if prefix_lens is not None:
        rows = sum(prefix_lens)
        pk = torch.randn(rows, hkv, d, device=DEVICE).to(dtype)
        pv = torch.randn(rows, hkv, d, device=DEVICE).to(dtype)
        prefix = DenseSegment(pk, pv, start_loc(prefix_lens))
    out = torch.full_like(q, float("nan"))
    paged_decode_attention(q, kv.layer, kv.block_tables, kv.seq_lens, d**-0.5, out=out,
                           prefix=prefix, **kw)  # type: ignore[arg-type]
    ref = paged_decode_attention_ref(q, kv.layer, kv.block_tables, kv.seq_lens, d**-0.5, prefix)
    assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (2, 2, 64), (8, 1, 128)])
@pytest.mark.parametrize("num_splits", [1, 3])
def test_decode_matches_reference(dtype: torch.dtype, hq: int, hkv: int, d: int,
                                  num_splits: int) -> None:
    # 1 token, a page boundary exactly, a long-ish one; block_n=32 spans two 16-token pages.
    # With 16 tokens a split at least, the rows get 1, 1, 3 and 2 of 3 splits: one-split rows
    # (written directly) and split rows (merged by the reduce) share the launch.
    _check([1, 16, 70, 33], hq, hkv, d, dtype, num_splits=num_splits, block_n=32,
           min_split_tokens=16)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_splits", [1, 4])
def test_decode_with_dense_prefix(dtype: torch.dtype, num_splits: int) -> None:
    # prefix shorter than a page, empty, longer than a tile, and the whole context but one.
    _check([20, 9, 75, 40], 4, 2, 64, dtype, prefix_lens=[5, 0, 37, 39],
           num_splits=num_splits, block_n=16, min_split_tokens=8)


def test_short_requests_skip_the_splits() -> None:
    """A launch fixed at 4 splits (a CUDA graph's) over requests of 1..4 splits' worth: a
    one-split row's output comes from its kernel alone, the reduce leaves it untouched, and
    every row still matches the reference."""
    _check([5, 40, 17, 100, 64], 2, 2, 64, torch.float32, num_splits=4, block_n=16,
           min_split_tokens=20)


def test_decode_default_splits_and_tiles() -> None:
    _check([3, 130], 4, 2, 64, torch.float32)  # num_splits from seq_lens.max(), default tile


def test_default_num_splits_fills_the_gpu() -> None:
    sms = 132  # H200
    assert default_num_splits(256, 8, 2048, sms) == 1  # 2048 programs already
    assert default_num_splits(1, 8, 100, sms) == 1  # too short to split
    assert default_num_splits(16, 8, 8192, sms) == 4  # 512 programs: 1.9 waves of 264
    assert default_num_splits(8, 40, 2048, sms) == 4  # 1280 programs: 4.8 waves of 264
    # 640 programs, 2.4 waves: two splits fill the last wave (4.8 waves).
    assert default_num_splits(16, 40, 2048, sms) == 2
    # Three waves or more: one split (mixed lengths smear the tail; the graph's count would
    # not match the lengths anyway).
    assert default_num_splits(100, 8, 4096, sms) == 1
    assert default_num_splits(32, 40, 2048, sms) == 1


def test_few_programs_split_into_shorter_ranges() -> None:
    sms = 132  # H200, 2 resident programs an SM
    assert default_min_split_tokens(1, 8, sms) == 64  # 8 programs: a fraction of a wave
    assert default_min_split_tokens(2, 8, sms) == 64
    assert default_min_split_tokens(10, 8, sms) == 128  # 80 programs
    assert default_min_split_tokens(32, 8, sms) == 128  # 256 < 264 slots
    assert default_min_split_tokens(33, 8, sms) == 256  # the slots are full
    assert default_min_split_tokens(8, 40, sms) == 256  # llama-2-13b: 320 programs


def test_large_launches_take_their_tiles() -> None:
    bf16 = torch.bfloat16
    assert default_tiles(512, 32, 8, 128, bf16) == MANY_PROGRAMS_TILES  # 4,096 programs
    assert default_tiles(511, 32, 8, 128, bf16) == LARGE_PROGRAMS_TILES
    assert default_tiles(128, 32, 8, 128, bf16) == LARGE_PROGRAMS_TILES  # 1,024 programs
    assert default_tiles(127, 32, 8, 128, bf16) == DecodeTiles(64, 4, 3)
    assert default_tiles(1024, 40, 40, 128, bf16) == DecodeTiles(64, 4, 3)  # MHA: unmeasured
    assert default_tiles(1024, 32, 8, 128, torch.float32) == DecodeTiles(32, 4, 3)  # fp32
    assert default_tiles(4096, 16, 2, 64, bf16) == DecodeTiles(128, 4, 3)  # head dim 64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_small_tiles_match_reference(dtype: torch.dtype) -> None:
    """The large-batch launch shape (32-token tiles, 2 warps, 3 stages) over short and
    page-straddling contexts, in the engine's longest-first order."""
    lens = [1, 16, 33, 70, 5, 48]
    t = MANY_PROGRAMS_TILES
    order = torch.tensor([3, 5, 2, 1, 4, 0], dtype=torch.int32, device=DEVICE)
    _check(lens, 8, 2, 128, dtype, num_splits=1, block_n=t.block_n, num_warps=t.num_warps,
           num_stages=t.num_stages, order=order)


def test_large_batch_tiles_match_reference() -> None:
    """The launch shape of 1,024-4,095 programs (64-token tiles, 2 warps, 4 stages) over
    contexts that end inside a tile, at and past a page edge."""
    t = LARGE_PROGRAMS_TILES
    _check([1, 16, 65, 130, 7, 64], 8, 2, 128, torch.bfloat16, num_splits=1,
           block_n=t.block_n, num_warps=t.num_warps, num_stages=t.num_stages)


@pytest.mark.parametrize("batch", [1, 6])
def test_small_batch_default_ranges_match_reference(batch: int) -> None:
    """A launch left to choose its own ranges at a small batch (64 or 128 tokens on the
    GPU, 64 here): long requests cut into many splits still merge to the reference."""
    lens = [300, 5, 129, 64, 200, 1][:batch]
    _check(lens, 4, 1, 64, torch.float32, num_splits=6, block_n=16)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (40, 40, 128), (16, 2, 64), (12, 4, 80)])
@pytest.mark.parametrize("num_splits", [None, 1, 7])
@gpu
def test_decode_gpu(dtype: torch.dtype, hq: int, hkv: int, d: int, num_splits: int | None) -> None:
    g = torch.Generator().manual_seed(hq * d + (num_splits or 0))
    seq_lens = torch.randint(1, 3000, (24,), generator=g).tolist() + [1, 16, 4096]
    _check(seq_lens, hq, hkv, d, dtype, num_splits=num_splits)


@gpu
def test_decode_many_requests_gpu() -> None:
    """Past MANY_PROGRAMS (520 x 8 KV heads) the default launch takes the small tiles."""
    g = torch.Generator().manual_seed(520)
    seq_lens = torch.randint(1, 400, (520,), generator=g).tolist()
    _check(seq_lens, 32, 8, 128, torch.bfloat16)


@gpu
def test_decode_large_batch_gpu() -> None:
    """200 requests x 8 KV heads: the default launch takes the large-batch tiles."""
    g = torch.Generator().manual_seed(200)
    seq_lens = torch.randint(1, 2500, (200,), generator=g).tolist()
    _check(seq_lens, 32, 8, 128, torch.bfloat16)


@pytest.mark.parametrize("num_splits", [None, 16])
@gpu
def test_decode_single_request_gpu(num_splits: int | None) -> None:
    """Batch 1 (64-token ranges by default), as the last steps of a run decode."""
    _check([927], 32, 8, 128, torch.bfloat16, num_splits=num_splits)
    _check([4000], 32, 8, 128, torch.float32, num_splits=num_splits)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@gpu
def test_decode_prefix_gpu(dtype: torch.dtype) -> None:
    seq_lens = [2000, 513, 64, 1500, 4000]
    _check(seq_lens, 32, 8, 128, dtype, prefix_lens=[300, 0, 63, 1500, 17], num_splits=5)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_launch_order_changes_no_output(num_splits: int) -> None:
    """Programs launched longest first, or in any permuted order, write the same rows."""
    lens = [5, 70, 33, 1, 48]
    for order in ([1, 4, 2, 0, 3], [3, 0, 4, 2, 1]):
        _check(lens, 4, 2, 64, torch.float32, num_splits=num_splits, block_n=16,
               min_split_tokens=16,
               order=torch.tensor(order, dtype=torch.int32, device=DEVICE))


def test_launch_order_must_be_int32() -> None:
    with pytest.raises(ValueError, match="order must be int32"):
        _check([5, 7], 2, 2, 64, torch.float32,
               order=torch.tensor([1, 0], dtype=torch.int64, device=DEVICE))


@gpu
def test_launch_order_gpu() -> None:
    g = torch.Generator().manual_seed(3)
    lens = torch.randint(1, 3000, (40,), generator=g)
    order = lens.argsort(descending=True).to(torch.int32).to(DEVICE)
    for num_splits in (1, 4):
        _check(lens.tolist(), 32, 8, 128, torch.bfloat16, num_splits=num_splits, order=order)
