"""Greedy decoding's pick: the index of each row's largest logit, as `torch.argmax(x, -1)`.

torch reduces a row of the 128k vocabulary in one block, so a few rows leave most of the GPU
idle at small batches (the last decode steps of a run, and every step of a lightly loaded
server). Here each row is cut into chunks that run in
parallel (their maxima and first indices), then one small program a row merges them.

Each value becomes an int32 key whose integer order is torch's order of the values, so a
chunk is one (max, first index) reduction over int32: the float's bits, the negative ones
flipped so that more negative sorts lower, -0.0 taken as +0.0 (they compare equal), and NaN
above everything (torch's argmax counts NaN as the largest value, the first NaN winning).
The first version made three reductions a chunk with int64 indices (NaN, max, first index)
and lost to torch at large batches (results/kernels/kernels_argmax_h200.json). This one is
faster at every batch measured (results/kernels/kernels_argmax_rotary_kv_write_h200_d41cae2.json,
`python -m benchmarks.kernels.bench_kernels --parts argmax --out ...`).

Exactly torch's answer: keys order values exactly (bf16/fp16 widen to fp32 exactly), the
first index of the maximum wins ties (the reduction breaks ties to the left and chunks merge
in column order), and a row of NaNs or of -inf answers as torch does.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, next_pow2
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel

BLOCK = 4096  # columns a chunk: 8 KiB of bf16, 32 chunks a row of Llama 3's vocabulary
_KEY_NAN = 2**31 - 1  # above +inf's key (0x7F800000)
_KEY_NONE = -(2**31)  # below -inf's key: masked columns and chunks


@triton.jit
def _order_key(x, valid, KEY_NAN: tl.constexpr, KEY_NONE: tl.constexpr):
    """int32 keys ordered as torch orders the fp32 values x (NaN largest, -0.0 == +0.0)."""
    x = tl.where(x == 0.0, 0.0, x)  # -0.0 -> +0.0
    bits = x.to(tl.int32, bitcast=True)
    key = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    key = tl.where(x != x, KEY_NAN, key)
    return tl.where(valid, key, KEY_NONE)


@triton.jit
def _chunk_max_kernel(
    x_ptr, stride_x, V,  # [B, V]
    key_ptr, idx_ptr,  # [B, num_chunks] int32 each: the chunk's largest key, its first column
    BLOCK: tl.constexpr, KEY_NAN: tl.constexpr, KEY_NONE: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    cols = chunk * BLOCK + tl.arange(0, BLOCK)
    valid = cols < V
    x = tl.load(x_ptr + row * stride_x + cols, mask=valid, other=0.0).to(tl.float32)
    key, first = tl.max(_order_key(x, valid, KEY_NAN, KEY_NONE), 0, return_indices=True,
                        return_indices_tie_break_left=True)
    out = row * tl.num_programs(1) + chunk
    tl.store(key_ptr + out, key)
    tl.store(idx_ptr + out, chunk * BLOCK + first)


@triton.jit
def _merge_chunks_kernel(
    key_ptr, idx_ptr, num_chunks,  # [B, num_chunks]
    out_ptr,  # [B] int64
    C_PAD: tl.constexpr, KEY_NONE: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    row = tl.program_id(0).to(tl.int64)
    c = tl.arange(0, C_PAD)
    keys = tl.load(key_ptr + row * num_chunks + c, mask=c < num_chunks, other=KEY_NONE)
    # The first chunk holding the row's largest key holds its first index.
    _, first_chunk = tl.max(keys, 0, return_indices=True, return_indices_tie_break_left=True)
    idx = tl.load(idx_ptr + row * num_chunks + first_chunk)
    tl.store(out_ptr + row, idx.to(tl.int64))


def argmax_rows(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """x [B, V] (last dim contiguous) -> [B] int64: torch.argmax(x, dim=-1)."""
    check(x.dim() == 2, lambda: f"argmax_rows takes [B, V] logits, got {tuple(x.shape)}")
    check(x.stride(-1) == 1, "logits: last dim must be contiguous")
    check(x.dtype in (torch.float32, torch.bfloat16, torch.float16),
          lambda: f"argmax_rows takes fp32/bf16/fp16 logits, got {x.dtype}")
    check(block >= 16 and block & (block - 1) == 0, "block must be a power of two >= 16")
    B, V = x.shape
    check(V > 0, "argmax of an empty row")
    check(V < 2**31 - block, "rows must have fewer than 2**31 columns (int32 indices)")
    out = torch.empty(B, dtype=torch.int64, device=x.device)
    if B == 0:
        return out
    pdl = pdl_launch(x.device)
    chunks = triton.cdiv(V, block)
    keys = torch.empty(B, chunks, dtype=torch.int32, device=x.device)
    idxs = torch.empty(B, chunks, dtype=torch.int32, device=x.device)
    _chunk_max_kernel[(B, chunks)](x, x.stride(0), V, keys, idxs, BLOCK=block,
                                   KEY_NAN=_KEY_NAN, KEY_NONE=_KEY_NONE, num_warps=4, **pdl)
    _merge_chunks_kernel[(B,)](keys, idxs, chunks, out, C_PAD=max(16, next_pow2(chunks)),
                               KEY_NONE=_KEY_NONE, num_warps=1, **pdl)
    return out


def argmax_rows_ref(x: torch.Tensor) -> torch.Tensor:
    return x.argmax(dim=-1)
