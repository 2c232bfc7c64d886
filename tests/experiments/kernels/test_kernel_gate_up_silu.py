"""The fused gate_up projection + SiLU * up against the unfused torch path."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from benchmarks.experiments.kernels.gate_up_silu import GateUpTiles, gate_up_silu, gate_up_silu_ref
from tests.kernels.kernel_testing import DEVICE, INTERPRET, assert_close, gpu


def _check(m: int, inter: int, k: int, dtype: torch.dtype, tiles: GateUpTiles) -> None:
    x = torch.randn(m, k, device=DEVICE).to(dtype)
    w = (torch.randn(2 * inter, k, device=DEVICE) / k**0.5).to(dtype)
    out = gate_up_silu(x, w, tiles)
    # On the GPU the kernel rounds where the unfused path in the same dtype does (the
    # projection, the SiLU, the product); under the interpreter it rounds once, as the fp32
    # oracle rounded to the dtype does.
    ref = (gate_up_silu_ref(x.float(), w.float()).to(dtype) if INTERPRET
           else gate_up_silu_ref(x, w))
    assert out.shape == (m, inter) and out.dtype == dtype
    assert_close(out, ref, dtype)


SMALL = GateUpTiles(block_m=16, block_h=16, block_k=16, num_warps=1, num_stages=1)


# Ragged rows, columns and K (masked tails), and an even K with several K steps.
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m,inter,k", [(5, 72, 40), (33, 40, 64), (24, 40, 24)])
def test_gate_up_silu(m: int, inter: int, k: int, dtype: torch.dtype) -> None:
    _check(m, inter, k, dtype, SMALL)


def test_gate_up_silu_bad_input() -> None:
    x = torch.randn(4, 32, device=DEVICE)
    assert gate_up_silu(x[:0], torch.randn(64, 32, device=DEVICE)).shape == (0, 32)
    with pytest.raises(ValueError, match="gate and up"):
        gate_up_silu(x, torch.randn(63, 32, device=DEVICE))
    with pytest.raises(ValueError, match="want"):
        gate_up_silu(x, torch.randn(64, 16, device=DEVICE))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("m", [1, 100, 256, 1000])
@pytest.mark.parametrize("tiles", [GateUpTiles(), GateUpTiles(128, 64, 64, 8, 4),
                                   GateUpTiles(64, 128, 64, 8, 3)])
@gpu
def test_gate_up_silu_gpu(m: int, dtype: torch.dtype, tiles: GateUpTiles) -> None:
    if dtype == torch.float32:  # fp32 operands double a pipeline stage's shared memory
        tiles = replace(tiles, block_k=32, num_stages=2)
    _check(m, 14336, 4096, dtype, tiles)
