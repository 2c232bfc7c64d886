"""rotary_kv_write vs the two kernels it fuses (bit for bit) and vs its torch reference:
the rotated q, and the rotated k and v in their slots, nothing else touched."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.kv_write import kv_write
from kvtier.kernels.rotary import rotary
from kvtier.kernels.rotary_kv_write import rotary_kv_write, rotary_kv_write_ref
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu


def _cos_sin(max_pos: int, d: int) -> torch.Tensor:
    """[max_pos, d] fp32: cos of the d/2 frequencies, then their sin."""
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def _by_slot(layer: torch.Tensor) -> torch.Tensor:
    """[num_blocks, 2, block_size, H, D] -> [num_blocks * block_size, 2, H, D]: row = slot."""
    return layer.transpose(1, 2).flatten(0, 1)


def _check(T: int, hq: int, hkv: int, d: int, dtype: torch.dtype, num_blocks: int = 8,
           block_size: int = 16, num_kv_tokens: int | None = None,
           skip_some: bool = False) -> None:
    g = torch.Generator().manual_seed(T * 7 + hq)
    # F = 3 layers per block, writing slot 1: the layer view is strided, and q, k, v are
    # views of one qkv projection output, as the model hands them over.
    cache = torch.randn(num_blocks, 3, 2, block_size, hkv, d, generator=g).to(dtype).to(DEVICE)
    qkv = torch.randn(T, hq + 2 * hkv, d, generator=g).to(dtype).to(DEVICE)
    q, k, v = qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :]
    positions = torch.randint(0, 4096, (T,), generator=g).to(DEVICE)
    cs = _cos_sin(4096, d)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:T].to(DEVICE)
    if skip_some:
        slots[::3] = -1  # padding tokens: no slot
    n = T if num_kv_tokens is None else num_kv_tokens

    expected = cache.clone()
    q_ref = rotary_kv_write_ref(q, k, v, positions, cs, expected[:, 1], slots, n)
    apart = cache.clone()  # the two kernels this one fuses
    q_apart, k_apart = rotary(q, k, positions, cs)
    kv_write(apart[:, 1], k_apart[:n], v[:n], slots)

    q_out = rotary_kv_write(q, k, v, positions, cs, cache[:, 1], slots, n)
    assert torch.equal(q_out, q_apart) and torch.equal(cache, apart)
    assert_close(q_out, q_ref)
    # The random initial contents act as poison: any slot written wrongly or not at all shows.
    untouched = torch.ones(num_blocks * block_size, dtype=torch.bool, device=DEVICE)
    written = slots[:n][slots[:n] >= 0]
    untouched[written] = False
    rows, ref_rows = _by_slot(cache[:, 1]), _by_slot(expected[:, 1])
    assert torch.equal(rows[untouched], ref_rows[untouched])
    assert_close(rows[written], ref_rows[written])
    assert torch.equal(cache[:, [0, 2]], expected[:, [0, 2]])  # the other layers' slots


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(8, 2, 64), (3, 3, 128), (4, 1, 80)])
def test_rotary_kv_write(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    _check(37, hq, hkv, d, dtype)


def test_rows_past_num_kv_tokens_and_negative_slots_store_nothing() -> None:
    _check(20, 8, 2, 64, torch.float32, num_kv_tokens=13, skip_some=True)


def test_bad_input_is_refused() -> None:
    cs = _cos_sin(16, 64)
    cache = torch.zeros(2, 2, 16, 2, 64, device=DEVICE)
    q = torch.zeros(3, 4, 64, device=DEVICE)
    k = torch.zeros(3, 2, 64, device=DEVICE)
    pos = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    slots = torch.zeros(3, dtype=torch.int64, device=DEVICE)
    with pytest.raises(ValueError, match="num_kv_tokens"):
        rotary_kv_write(q, k, k, pos, cs, cache, slots, num_kv_tokens=4)
    with pytest.raises(ValueError, match="dtype mismatch"):
        rotary_kv_write(q, k, k, pos, cs, cache.bfloat16(), slots)
    with pytest.raises(ValueError, match="slots"):
        rotary_kv_write(q, k, k, pos, cs, cache, slots.int())
    with pytest.raises(ValueError, match="k "):
        rotary_kv_write(q, k[:, :1], k[:, :1], pos, cs, cache, slots)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (40, 40, 128), (8, 2, 64)])
@gpu
def test_rotary_kv_write_gpu(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    _check(4000, hq, hkv, d, dtype, num_blocks=1024, num_kv_tokens=3990, skip_some=True)
