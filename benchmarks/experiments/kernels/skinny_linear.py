"""A linear layer for a few token rows: out[M, N] = x[M, K] @ w[N, K]^T, w as nn.Linear keeps it.

With up to 128 rows a decode step's GEMMs only stream their weights, yet cuBLAS reads the
4,096-wide ones (o_proj, down_proj) at 53-82 % of HBM speed on the H200 and qkv at 53-78 %
(results/kernels/gemm_shapes_h200.json): N / its tile leaves few programs, or it splits K
and adds a reduction launch. Here one program owns BLOCK_N output columns for every row (one
M tile, so each weight is read once), streams its [BLOCK_N, K] slice of w through a
NUM_STAGES-deep pipeline and accumulates in fp32: N / BLOCK_N programs, no split, no
reduction, deterministic.

Kept for the record, not used by the engine: against cuBLAS on llama-3.1-8b's decode GEMMs
(results/experiments/skinny_linear_h200_4730968.json,
`python -m benchmarks.experiments.bench_skinny_linear
--out ...`, the best of 8 tile configurations per shape) it wins on o_proj at 1-32 rows (11.8-
12.1 us against 12.8-13.9, still 65-67 % of the weights' floor) and on down_proj at 1-64 rows
(2-8 %), loses on qkv and gate_up, and loses on everything at 96 and 128 rows (15-49 %). Taken
where it wins, a decode step's GEMMs would save 0.08-0.10 ms of ~3.8 ms at 1-64 rows: ~0.1 %
of the offline ShareGPT run.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, dot_precision, next_pow2, upcast

MAX_ROWS = 128  # one M tile of at most this many rows


@triton.jit
def _skinny_linear_kernel(
    x_ptr, stride_xm,  # [M, K], K contiguous
    w_ptr, stride_wn,  # [N, K], K contiguous
    out_ptr, stride_om,  # [M, N], N contiguous
    M, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    pid_n = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    x_rows = x_ptr + rm[:, None].to(tl.int64) * stride_xm
    w_rows = w_ptr + rn[:, None].to(tl.int64) * stride_wn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        x = tl.load(x_rows + kk[None, :], mask=(rm < M)[:, None] & (kk < K)[None, :], other=0.0)
        w = tl.load(w_rows + kk[None, :], mask=(rn < N)[:, None] & (kk < K)[None, :], other=0.0)
        if UPCAST:  # the interpreter's bf16 arithmetic is unreliable
            x = x.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(x, tl.trans(w), acc, input_precision=PRECISION)
    out = out_ptr + rm[:, None].to(tl.int64) * stride_om + rn[None, :]
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rm < M)[:, None] & (rn < N)[None, :])


def skinny_linear(
    x: torch.Tensor,  # [M, K], M <= MAX_ROWS
    w: torch.Tensor,  # [N, K]
    *,
    block_n: int = 32,
    block_k: int = 128,
    num_warps: int = 4,
    num_stages: int = 4,
    out: torch.Tensor | None = None,  # [M, N]
) -> torch.Tensor:
    """F.linear(x, w) for M <= MAX_ROWS rows (no bias)."""
    check(x.dim() == 2 and w.dim() == 2 and x.shape[1] == w.shape[1],
          lambda: f"x {tuple(x.shape)} and w {tuple(w.shape)}: want [M, K] and [N, K]")
    M, K = x.shape
    N = w.shape[0]
    check(M <= MAX_ROWS, lambda: f"skinny_linear takes at most {MAX_ROWS} rows, got {M}")
    check(x.dtype == w.dtype, lambda: f"dtype mismatch: x {x.dtype}, w {w.dtype}")
    check(x.stride(1) == 1 and w.stride(1) == 1, "x, w: last dim must be contiguous")
    for name, v in (("block_n", block_n), ("block_k", block_k)):
        check(v >= 16 and v & (v - 1) == 0, f"{name} must be a power of two >= 16")
    out = torch.empty(M, N, dtype=x.dtype, device=x.device) if out is None else out
    check(out.shape == (M, N) and out.stride(1) == 1, "out: [M, N], last dim contiguous")
    if M == 0:
        return out
    _skinny_linear_kernel[(triton.cdiv(N, block_n),)](
        x, x.stride(0), w, w.stride(0), out, out.stride(0), M, N, K,
        BLOCK_M=max(16, next_pow2(M)), BLOCK_N=block_n, BLOCK_K=block_k,
        UPCAST=upcast(x.dtype), PRECISION=dot_precision(x.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out


def skinny_linear_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Pure torch, fp32 accumulation, one rounding: the oracle."""
    return (x.float() @ w.float().t()).to(x.dtype)
