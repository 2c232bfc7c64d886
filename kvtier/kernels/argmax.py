"""Greedy decoding's pick: the index of each row's largest logit, as `torch.argmax(x, -1)`.

torch reduces a row of the 128k vocabulary in one block, so a few rows leave most of the GPU
idle: 26 us for one row of bf16 logits, 32 us for 8 (the last decode steps of a run, and
every step of a lightly loaded server). Here each row is cut into chunks that run in
parallel (their maxima and first indices), then one small program a row merges them: 3.9 us
for one row, 5.4 for 8, 20 for 64 (against 38). Past that torch is faster: 47 against 65 us
at 256 rows, 143 against 234 at 992, where the chunks' int64 index reductions, not the
bytes, bound this kernel (benchmarks/results/kernels_argmax_h200.json, `python
benchmarks/bench_kernels.py --parts argmax`). So the ops use it up to MAX_KERNEL_ROWS.

Exactly torch's answer: values compare in fp32 (exact for bf16/fp16), the first index of the
maximum wins ties (chunks merge in column order), and NaN counts as the largest value (the
first NaN wins), so a row of NaNs or of -inf answers as torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, next_pow2

BLOCK = 4096  # columns a chunk: 8 KiB of bf16, 32 chunks a row of Llama 3's vocabulary
MAX_KERNEL_ROWS = 64  # the largest batch measured faster than torch's argmax
_NO_INDEX = 2**62  # larger than any column: the neutral element of "first index"


@triton.jit
def _first_max(x, cols, valid, NO_INDEX: tl.constexpr):
    """(value, index) of the first maximum of x over `valid`, NaN counting as largest:
    (NaN, index of the first NaN) where there is one."""
    is_nan = (x != x) & valid
    first_nan = tl.min(tl.where(is_nan, cols, NO_INDEX), 0)
    finite = tl.where(valid & ~is_nan, x, float("-inf"))
    top = tl.max(finite, 0)
    first_top = tl.min(tl.where(valid & ~is_nan & (finite == top), cols, NO_INDEX), 0)
    has_nan = first_nan < NO_INDEX
    return tl.where(has_nan, float("nan"), top), tl.where(has_nan, first_nan, first_top)


@triton.jit
def _chunk_max_kernel(
    x_ptr, stride_x, V,  # [B, V]
    val_ptr, idx_ptr,  # [B, num_chunks] fp32, int64
    BLOCK: tl.constexpr, NO_INDEX: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
    valid = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=valid, other=0.0).to(tl.float32)
    val, idx = _first_max(x, cols, valid, NO_INDEX)
    out = row * tl.num_programs(1) + chunk
    tl.store(val_ptr + out, val)
    tl.store(idx_ptr + out, idx)


@triton.jit
def _merge_chunks_kernel(
    val_ptr, idx_ptr, num_chunks,  # [B, num_chunks]
    out_ptr,  # [B] int64
    C_PAD: tl.constexpr, NO_INDEX: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, C_PAD)
    valid = c < num_chunks
    vals = tl.load(val_ptr + row * num_chunks + c, mask=valid, other=0.0)
    # The first chunk holding the row's maximum (or its first NaN) holds its first index.
    _, first_chunk = _first_max(vals, c.to(tl.int64), valid, NO_INDEX)
    tl.store(out_ptr + row, tl.load(idx_ptr + row * num_chunks + first_chunk))


def argmax_rows(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """x [B, V] (last dim contiguous) -> [B] int64: torch.argmax(x, dim=-1)."""
    check(x.dim() == 2, lambda: f"argmax_rows takes [B, V] logits, got {tuple(x.shape)}")
    check(x.stride(-1) == 1, "logits: last dim must be contiguous")
    check(block >= 16 and block & (block - 1) == 0, "block must be a power of two >= 16")
    B, V = x.shape
    check(V > 0, "argmax of an empty row")
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    if B == 0:
        return out
    chunks = triton.cdiv(V, block)
    vals = torch.empty(B, chunks, dtype=torch.float32, device=x.device)
    idxs = torch.empty(B, chunks, dtype=torch.int64, device=x.device)
    _chunk_max_kernel[(B, chunks)](x, x.stride(0), V, vals, idxs, BLOCK=block,
                                   NO_INDEX=_NO_INDEX, num_warps=4)
    _merge_chunks_kernel[(B,)](vals, idxs, chunks, out, C_PAD=max(16, next_pow2(chunks)),
                               NO_INDEX=_NO_INDEX, num_warps=1)
    return out


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)
