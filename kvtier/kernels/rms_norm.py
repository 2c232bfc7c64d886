"""RMSNorm and residual-add + RMSNorm, one row per program, with HF Llama's rounding:

    h = x.float(); h = h * rsqrt(mean(h^2) + eps); out = weight * h.to(x.dtype)

and for the fused form `summed = x + residual` rounded to the input dtype first (HF adds the
residual in the model dtype), returning (rms_norm(summed), summed). Fusing saves the separate
add kernel's read-write of the hidden state: one read of x and residual, two writes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, next_pow2
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel


@triton.jit
def _rms_norm_kernel(
    x_ptr, stride_x,  # [N, H]
    res_ptr, stride_res,  # [N, H] (HAS_RESIDUAL)
    w_ptr,  # [H]
    out_ptr, stride_out,  # [N, H]
    sum_ptr, stride_sum,  # [N, H] x + residual (HAS_RESIDUAL)
    eps,
    H: tl.constexpr, BLOCK: tl.constexpr, HAS_RESIDUAL: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        res = tl.load(res_ptr + row * stride_res + cols, mask=mask, other=0.0)
        # Round the sum to the input dtype, as the torch model does, before normalising it.
        x = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + row * stride_sum + cols, x, mask=mask)
    h = x.to(tl.float32)
    h = h * tl.rsqrt(tl.sum(h * h, 0) / H + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    y = w * h.to(x.dtype).to(tl.float32)
    tl.store(out_ptr + row * stride_out + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _launch(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
            eps: float, num_warps: int | None = None
            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    H = x.shape[-1]
    check(weight.shape == (H,) and weight.is_contiguous(), lambda: f"weight: [{H}] contiguous")
    check(x.stride(-1) == 1, "x: last dim must be contiguous")
    x2 = x.reshape(-1, H)
    # weight * h.to(x.dtype) follows torch type promotion (an fp32 weight gives fp32 out).
    out = torch.empty(x2.shape, dtype=torch.promote_types(weight.dtype, x.dtype), device=x.device)
    summed = None
    r2 = x2
    if residual is not None:
        check(residual.shape == x.shape and residual.dtype == x.dtype
              and residual.stride(-1) == 1, "residual: same shape/dtype as x, last dim contiguous")
        r2 = residual.reshape(-1, H)
        summed = torch.empty_like(x2)
    s2 = summed if summed is not None else out
    if x2.shape[0] > 0:
        BLOCK = next_pow2(H)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2.stride(0), r2, r2.stride(0), weight, out, out.stride(0), s2, s2.stride(0), eps,
            H=H, BLOCK=BLOCK, HAS_RESIDUAL=residual is not None,
            # one 16-byte vector per thread per pass: 4096 bf16 -> 8 warps
            num_warps=num_warps or max(1, min(16, BLOCK // 512)), **pdl_launch(x.device),
        )
    shape = x.shape
    return out.view(shape), (summed.view(shape) if summed is not None else None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, *,
             num_warps: int | None = None) -> torch.Tensor:
    """x [..., H], weight [H] -> [..., H]"""
    return _launch(x, None, weight, eps, num_warps)[0]


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, *,
    num_warps: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., H] -> (rms_norm(x + residual), x + residual)"""
    out, summed = _launch(x, residual, weight, eps, num_warps)
    assert summed is not None
    return out, summed


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def fused_add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    summed = x + residual
    return rms_norm_ref(summed, weight, eps), summed
