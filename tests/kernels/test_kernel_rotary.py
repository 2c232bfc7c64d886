"""Neox rotary vs its torch reference, and TritonOps vs the model's TorchOps."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.ops import TritonOps
from kvtier.kernels.rotary import rotary, rotary_ref
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu


def _cache(max_pos: int, d: int) -> torch.Tensor:
    """[max_pos, d] fp32: cos of the d/2 frequencies, then their sin."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
    freqs = torch.outer(torch.arange(max_pos).float(), inv_freq)
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(DEVICE)


def _check(T: int, hq: int, hkv: int, d: int, dtype: torch.dtype, inplace: bool) -> None:
    qkv = torch.randn(T, hq + 2 * hkv, d, device=DEVICE).to(dtype)
    q, k = qkv[:, :hq], qkv[:, hq : hq + hkv]  # strided views of a fused projection
    v_before = qkv[:, hq + hkv :].clone()
    cache = _cache(4096, d)
    pos = torch.randint(0, 4096, (T,), device=DEVICE)
    ref_q, ref_k = rotary_ref(q, k, pos, cache)
    out_q, out_k = rotary(q, k, pos, cache, inplace=inplace)
    if inplace:
        assert out_q.data_ptr() == q.data_ptr() and out_k.data_ptr() == k.data_ptr()
    else:
        out_q, out_k = out_q.clone(), out_k.clone()  # no aliasing with the inputs
    assert_close(out_q, ref_q)
    assert_close(out_k, ref_k)
    assert torch.equal(qkv[:, hq + hkv :], v_before), "touched the v part of qkv"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 64), (3, 3, 32), (2, 1, 128)])
@pytest.mark.parametrize("inplace", [False, True])
def test_rotary(dtype: torch.dtype, hq: int, hkv: int, d: int, inplace: bool) -> None:
    _check(9, hq, hkv, d, dtype, inplace)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_ops_match_torch_ops(dtype: torch.dtype) -> None:
    model_ops = pytest.importorskip("kvtier.model.ops")
    ref_ops, ops = model_ops.TorchOps(), TritonOps()
    q = torch.randn(5, 4, 64, device=DEVICE).to(dtype)
    k = torch.randn(5, 2, 64, device=DEVICE).to(dtype)
    pos = torch.tensor([0, 1, 7, 300, 2047], device=DEVICE)
    cache = _cache(2048, 64)
    for out, ref in zip(ops.rotary(q, k, pos, cache), ref_ops.rotary(q, k, pos, cache)):
        assert_close(out, ref)
    x, res = torch.randn(2, 3, 96, device=DEVICE).to(dtype), torch.randn(2, 3, 96).to(dtype)
    w = torch.rand(96, device=DEVICE).to(dtype)
    assert_close(ops.rms_norm(x, w, 1e-6), ref_ops.rms_norm(x, w, 1e-6))
    for out, ref in zip(ops.fused_add_rms_norm(x, res.to(DEVICE), w, 1e-6),
                        ref_ops.fused_add_rms_norm(x, res.to(DEVICE), w, 1e-6)):
        assert_close(out, ref)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (40, 40, 128), (28, 4, 128), (14, 2, 64)])
@gpu
def test_rotary_gpu(dtype: torch.dtype, hq: int, hkv: int, d: int) -> None:
    for inplace in (False, True):
        _check(3000, hq, hkv, d, dtype, inplace)
