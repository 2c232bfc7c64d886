"""Attention over a context in two disjoint parts from each part's output and log-sum-exp,
in one pass: the host prefix and the device suffix of a row whose oldest KV blocks are in
host memory (a memory system's split rows). Per (row, head):

    m = max(lse1, lse2);  w_i = exp(lse_i - m);  out = (o1 w1 + o2 w2) / (w1 + w2)

An empty part has lse -inf and weight 0. One launch writes `out` in its dtype, where the
torch reference (the CPU path and the oracle) runs a dozen small kernels and a copy: inside
a decode graph each launch costs microseconds a layer.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, check_last_dim_contiguous, next_pow2


@triton.jit
def _merge_two_kernel(
    o1_ptr, s1b, s1h, lse1_ptr,  # [B, H, D], [B, H] fp32 contiguous
    o2_ptr, s2b, s2h, lse2_ptr,
    out_ptr, sob, soh,
    num_heads,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    d = tl.arange(0, D_PAD)
    ok = d < HEAD_DIM
    l1 = tl.load(lse1_ptr + b * num_heads + h)
    l2 = tl.load(lse2_ptr + b * num_heads + h)
    m = tl.maximum(l1, l2)
    w1 = tl.exp(l1 - m)
    w2 = tl.exp(l2 - m)
    a = tl.load(o1_ptr + b * s1b + h * s1h + d, mask=ok, other=0.0).to(tl.float32)
    c = tl.load(o2_ptr + b * s2b + h * s2h + d, mask=ok, other=0.0).to(tl.float32)
    merged = (a * w1 + c * w2) / (w1 + w2)
    tl.store(out_ptr + b * sob + h * soh + d, merged.to(out_ptr.dtype.element_ty), mask=ok)


def _check_args(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor, lse2: torch.Tensor,
                out: torch.Tensor) -> None:
    check(o1.dim() == 3 and o1.shape == o2.shape == out.shape,
          lambda: f"o1, o2 and out must be one [B, H, D], got {tuple(o1.shape)}, "
                  f"{tuple(o2.shape)}, {tuple(out.shape)}")
    for name, lse in (("lse1", lse1), ("lse2", lse2)):
        check(lse.shape == o1.shape[:2] and lse.dtype == torch.float32 and lse.is_contiguous(),
              f"{name} must be contiguous [B, H] fp32")
    for name, t in (("o1", o1), ("o2", o2), ("out", out)):
        check_last_dim_contiguous(name, t)


def merge_attention(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                    lse2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Writes the merge of (o1, lse1) and (o2, lse2) into `out` ([B, H, D], any float
    dtype; o1 and o2 may be of another) and returns it. Capturable: nothing allocated."""
    _check_args(o1, lse1, o2, lse2, out)
    batch, heads, dim = out.shape
    if batch:
        _merge_two_kernel[(batch, heads)](
            o1, o1.stride(0), o1.stride(1), lse1, o2, o2.stride(0), o2.stride(1), lse2,
            out, out.stride(0), out.stride(1), heads,
            HEAD_DIM=dim, D_PAD=max(16, next_pow2(dim)), num_warps=1,
        )
    return out


def merge_attention_ref(o1: torch.Tensor, lse1: torch.Tensor, o2: torch.Tensor,
                        lse2: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    _check_args(o1, lse1, o2, lse2, out)
    m = torch.maximum(lse1, lse2)
    w1, w2 = torch.exp(lse1 - m).unsqueeze(-1), torch.exp(lse2 - m).unsqueeze(-1)
    out.copy_((o1.float() * w1 + o2.float() * w2) / (w1 + w2))
    return out
