"""RMSNorm and fused residual-add RMSNorm vs HF Llama's math."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.rms_norm import (
    fused_add_rms_norm,
    fused_add_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu

# (x dtype, weight dtype): the model's dtype for both, and an fp32 weight (promotes to fp32).
DTYPES = [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
          (torch.bfloat16, torch.float32)]


def _inputs(shape: tuple[int, ...], dtype: torch.dtype, wdtype: torch.dtype
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = (torch.randn(shape, device=DEVICE) * 3).to(dtype)
    res = torch.randn(shape, device=DEVICE).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], device=DEVICE)).to(wdtype)
    return x, res, w


def _check(shape: tuple[int, ...], dtype: torch.dtype, wdtype: torch.dtype) -> None:
    x, res, w = _inputs(shape, dtype, wdtype)
    out = rms_norm(x, w, 1e-6)
    ref = rms_norm_ref(x, w, 1e-6)
    assert out.dtype == ref.dtype
    assert_close(out, ref, dtype)
    out, summed = fused_add_rms_norm(x, res, w, 1e-5)
    ref, ref_summed = fused_add_rms_norm_ref(x, res, w, 1e-5)
    assert out.dtype == ref.dtype and summed.dtype == ref_summed.dtype
    assert_close(out, ref, dtype)
    assert_close(summed, ref_summed, dtype)


@pytest.mark.parametrize("dtype,wdtype", DTYPES)
@pytest.mark.parametrize("shape", [(7, 96), (2, 3, 64), (1, 256)])
def test_rms_norm(dtype: torch.dtype, wdtype: torch.dtype, shape: tuple[int, ...]) -> None:
    _check(shape, dtype, wdtype)


def test_rms_norm_empty() -> None:
    x, res, w = _inputs((0, 64), torch.float32, torch.float32)
    assert rms_norm(x, w, 1e-6).shape == (0, 64)
    assert fused_add_rms_norm(x, res, w, 1e-6)[1].shape == (0, 64)


@pytest.mark.parametrize("dtype,wdtype", DTYPES)
@pytest.mark.parametrize("shape", [(512, 4096), (33, 5120), (3, 8192)])
@gpu
def test_rms_norm_gpu(dtype: torch.dtype, wdtype: torch.dtype, shape: tuple[int, ...]) -> None:
    _check(shape, dtype, wdtype)
