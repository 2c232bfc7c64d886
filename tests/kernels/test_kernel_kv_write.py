"""kv_write vs its torch reference: an exact copy into the right slots, nothing else touched."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.kv_write import kv_write, kv_write_ref
from tests.kernels.kernel_testing import DEVICE, gpu


def _check(T: int, hkv: int, d: int, dtype: torch.dtype, num_blocks: int = 8,
           block_size: int = 16, skip_some: bool = False, k_contiguous: bool = False) -> None:
    # F = 3 layers per block, writing slot 1: the layer view is strided.
    cache = torch.randn(num_blocks, 3, 2, block_size, hkv, d, device=DEVICE).to(dtype)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:T]
    if skip_some:
        slots[::3] = -1  # padding tokens: no slot
    kv = torch.randn(T, 2 * hkv + 4, d, device=DEVICE).to(dtype)  # strided k/v views
    k, v = kv[:, :hkv], kv[:, hkv : 2 * hkv]
    if k_contiguous:  # as in the model: k comes out of rotary fresh, v stays a qkv view
        k = k.contiguous()
    expected = cache.clone()
    kv_write_ref(expected[:, 1], k, v, slots)
    kv_write(cache[:, 1], k, v, slots)
    # The random initial contents act as poison: any slot written wrongly or not at all shows.
    assert torch.equal(cache, expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hkv,d", [(2, 64), (3, 128), (1, 80)])
def test_kv_write(dtype: torch.dtype, hkv: int, d: int) -> None:
    _check(37, hkv, d, dtype)


def test_kv_write_k_and_v_with_different_strides() -> None:
    _check(21, 2, 64, torch.float32, k_contiguous=True)


def test_kv_write_skips_negative_slots() -> None:
    _check(20, 2, 64, torch.float32, skip_some=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hkv,d", [(8, 128), (40, 128), (2, 64)])
@gpu
def test_kv_write_gpu(dtype: torch.dtype, hkv: int, d: int) -> None:
    _check(4000, hkv, d, dtype, num_blocks=1024, skip_some=True)
