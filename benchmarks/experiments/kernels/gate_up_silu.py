"""SwiGLU's first half in one kernel: silu(x @ W_gate^T) * (x @ W_up^T), from the fused
[2I, K] gate_up weight, without writing the [M, 2I] projection.

cuBLAS + `silu_and_mul` writes the projection (2I values a row), reads it back and writes the
I-wide product: at 256 decode rows of llama-3.1-8b that is 37 MB a layer, ~1.2 GB a step
besides the 15 GB of weights. Here each program owns BLOCK_M rows x BLOCK_H columns of the
product: it streams the matching gate rows and up rows of the weight (W[h] and W[I + h])
against the same x tile into two fp32 accumulators and applies the activation in its
epilogue, so only the product is stored.

Rounding follows the unfused path (cuBLAS rounds the projection to the model dtype, then
`silu_and_mul`): each accumulator is rounded to the dtype, SiLU is computed in fp32 and
rounded, the product rounded once more. Sums run in a different order than cuBLAS's, so
bf16 results differ from it by an ulp here and there, as two GEMM libraries do. Under the
CPU interpreter, whose bf16 conversions truncate, the product is rounded once, at the store.

Programs run with the M tiles fastest: the programs of one weight slice start together and
share its reads through L2, so the weights are read from HBM about once (decode-sized M,
whose x fits in L2, is what this kernel is for).

Kept for the record, not used by the engine: against cuBLAS + `silu_and_mul` on llama-3.1-8b
(results/experiments/gate_up_silu_h200_2ae35da.json,
`python -m benchmarks.experiments.bench_gate_up_silu
--out ...`, the best of 11 launch shapes per token count) it wins only at 64 tokens (62.6 us
against 65.1) and loses from 128 on, by 21-31 % at 192-1024 (256 tokens: 121 us against 96).
Past ~128 rows the GEMM is compute-bound and cuBLAS's Hopper kernels (TMA, warp-specialized,
clustered) keep the tensor cores fed where this pointer-based tiling does not; the bytes the
fusion saves are worth less than that.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, dot_precision, upcast
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel
from kvtier.kernels.silu_and_mul import silu_and_mul_ref


@dataclass(frozen=True)
class GateUpTiles:
    """Launch shape: rows and product columns a program, K step, warps, pipeline stages."""

    block_m: int = 64
    block_h: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, stride_xm,  # [M, K], K contiguous
    w_ptr, stride_wn,  # [2I, K], K contiguous: gate rows, then up rows
    out_ptr, stride_om,  # [M, I], I contiguous
    M, inter, K,
    BLOCK_M: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    num_m = tl.cdiv(M, BLOCK_M)
    pid_m = tl.program_id(0) % num_m  # M tiles fastest: a weight slice's readers together
    pid_h = tl.program_id(0) // num_m
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rh = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    rk = tl.arange(0, BLOCK_K)
    m_ok = rm < M
    h_ok = rh < inter
    x_ptrs = x_ptr + rm[:, None].to(tl.int64) * stride_xm + rk[None, :]
    g_ptrs = w_ptr + rh[:, None].to(tl.int64) * stride_wn + rk[None, :]
    u_ptrs = w_ptr + (rh + inter)[:, None].to(tl.int64) * stride_wn + rk[None, :]
    acc_g = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_H), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if EVEN_K:
            x = tl.load(x_ptrs, mask=m_ok[:, None], other=0.0)
            g = tl.load(g_ptrs, mask=h_ok[:, None], other=0.0)
            u = tl.load(u_ptrs, mask=h_ok[:, None], other=0.0)
        else:
            k_ok = (k0 + rk < K)[None, :]
            x = tl.load(x_ptrs, mask=m_ok[:, None] & k_ok, other=0.0)
            g = tl.load(g_ptrs, mask=h_ok[:, None] & k_ok, other=0.0)
            u = tl.load(u_ptrs, mask=h_ok[:, None] & k_ok, other=0.0)
        if UPCAST:  # the interpreter's bf16 arithmetic is unreliable
            x = x.to(tl.float32)
            g = g.to(tl.float32)
            u = u.to(tl.float32)
        acc_g = tl.dot(x, tl.trans(g), acc_g, input_precision=PRECISION)
        acc_u = tl.dot(x, tl.trans(u), acc_u, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dtype = out_ptr.dtype.element_ty
    if UPCAST:  # the interpreter truncates where the GPU rounds: one rounding, at the store
        y = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
    else:
        gate = acc_g.to(dtype).to(tl.float32)  # the projection as the unfused path rounds it
        act = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
        y = act * acc_u.to(dtype).to(tl.float32)
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rh[None, :]
    tl.store(out, y.to(dtype), mask=m_ok[:, None] & h_ok[None, :])


def gate_up_silu(
    x: torch.Tensor,  # [M, K]
    w: torch.Tensor,  # [2I, K]: gate rows then up rows (nn.Linear layout)
    tiles: GateUpTiles = GateUpTiles(),
    *,
    out: torch.Tensor | None = None,  # [M, I]
) -> torch.Tensor:
    """silu(x @ w[:I].T) * (x @ w[I:].T), rounded as F.linear followed by silu_and_mul."""
    check(x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1],
          lambda: f"x {tuple(x.shape)} and w {tuple(w.shape)}: want [M, K] and [2I, K]")
    check(w.shape[0] % 2 == 0, lambda: f"w has {w.shape[0]} rows: want gate and up halves")
    check(x.dtype == w.dtype, lambda: f"dtype mismatch: x {x.dtype}, w {w.dtype}")
    check(x.stride(1) == 1 and w.stride(1) == 1, "x, w: last dim must be contiguous")
    M, K = x.shape
    inter = w.shape[0] // 2
    out = torch.empty(M, inter, dtype=x.dtype, device=x.device) if out is None else out
    check(out.shape == (M, inter) and out.stride(1) == 1 and out.dtype == x.dtype,
          lambda: f"out {tuple(out.shape)}: want [{M}, {inter}] of {x.dtype}, last dim contiguous")
    if M == 0:
        return out
    t = tiles
    grid = (triton.cdiv(M, t.block_m) * triton.cdiv(inter, t.block_h),)
    _gate_up_silu_kernel[grid](
        x, x.stride(0), w, w.stride(0), out, out.stride(0), M, inter, K,
        BLOCK_M=t.block_m, BLOCK_H=t.block_h, BLOCK_K=t.block_k, EVEN_K=K % t.block_k == 0,
        UPCAST=upcast(x.dtype), PRECISION=dot_precision(x.dtype),
        num_warps=t.num_warps, num_stages=t.num_stages, **pdl_launch(x.device),
    )
    return out


def gate_up_silu_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The unfused path in torch: the projection in the model dtype, then silu(gate) * up."""
    return silu_and_mul_ref(torch.nn.functional.linear(x, w))
