"""skinny_linear vs F.linear's math (fp32 accumulation): a few rows, every tile edge."""

from __future__ import annotations

import pytest
import torch

from benchmarks.experiments.kernels.skinny_linear import MAX_ROWS, skinny_linear, skinny_linear_ref
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu


def _check(M: int, N: int, K: int, dtype: torch.dtype, **kw: int) -> None:
    g = torch.Generator().manual_seed(M * 131 + N + K)
    x = torch.randn(M, K, generator=g).to(dtype).to(DEVICE)
    w = (torch.randn(N, K, generator=g) * 0.02).to(dtype).to(DEVICE)
    out = skinny_linear(x, w, **kw)
    assert out.shape == (M, N) and out.dtype == dtype
    assert_close(out, skinny_linear_ref(x, w))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M,N,K", [(1, 64, 96), (5, 80, 160), (16, 32, 64), (17, 48, 40)])
def test_skinny_linear(dtype: torch.dtype, M: int, N: int, K: int) -> None:
    # N and K not multiples of the tiles: masked edges in both
    _check(M, N, K, dtype, block_n=32, block_k=32, num_stages=2)


def test_strided_rows_and_given_output() -> None:
    x = torch.randn(6, 100, device=DEVICE)[:, :64]  # row stride 100
    w = torch.randn(40, 64, device=DEVICE)
    buf = torch.full((6, 40), float("nan"), device=DEVICE)
    out = skinny_linear(x, w, block_n=16, block_k=32, out=buf)
    assert out.data_ptr() == buf.data_ptr()
    assert_close(out, skinny_linear_ref(x, w))


def test_bad_input_is_refused() -> None:
    w = torch.zeros(8, 16, device=DEVICE)
    with pytest.raises(ValueError, match="at most"):
        skinny_linear(torch.zeros(MAX_ROWS + 1, 16, device=DEVICE), w)
    with pytest.raises(ValueError, match="want"):
        skinny_linear(torch.zeros(2, 8, device=DEVICE), w)
    with pytest.raises(ValueError, match="dtype"):
        skinny_linear(torch.zeros(2, 16, dtype=torch.bfloat16, device=DEVICE), w)
    with pytest.raises(ValueError, match="power of two"):
        skinny_linear(torch.zeros(2, 16, device=DEVICE), w, block_n=24)


@pytest.mark.parametrize("M", [1, 16, 96, 128])
@pytest.mark.parametrize("N,K", [(4096, 4096), (6144, 4096), (4096, 14336)])
@gpu
def test_skinny_linear_gpu_llama_shapes(M: int, N: int, K: int) -> None:
    _check(M, N, K, torch.bfloat16)
