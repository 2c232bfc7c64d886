"""Store one layer's new K/V rows into their paged slots.

One program per token: it reads the token's [Hkv, D] K and V (contiguous per token in the
qkv projection output) and writes them to block `slot // block_size`, row `slot %
block_size` of the layer view. A negative slot means "no slot" (padding tokens of a CUDA
graph batch) and writes nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, check_last_dim_contiguous, next_pow2


@triton.jit
def _kv_write_kernel(
    k_ptr, stride_kt, stride_kh,  # [T, Hkv, D]; k is rotated (a fresh tensor)
    v_ptr, stride_vt, stride_vh,  # [T, Hkv, D]; v is a strided view of the qkv output
    kv_ptr, stride_block, stride_kv, stride_tok, stride_head,  # [nb, 2, bs, Hkv, D]
    slots_ptr,  # [T] int64
    H: tl.constexpr, H_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slots_ptr + t)
    if slot >= 0:
        h = tl.arange(0, H_PAD)
        d = tl.arange(0, D_PAD)
        mask = (h < H)[:, None] & (d < HEAD_DIM)[None, :]
        t64 = t.to(tl.int64)
        k_src = t64 * stride_kt + h[:, None] * stride_kh + d[None, :]
        v_src = t64 * stride_vt + h[:, None] * stride_vh + d[None, :]
        dst = ((slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_tok
               + h[:, None] * stride_head + d[None, :])
        # No arithmetic, so bf16 passes through untouched (also in the interpreter).
        k = tl.load(k_ptr + k_src, mask=mask)
        v = tl.load(v_ptr + v_src, mask=mask)
        tl.store(kv_ptr + dst, k.to(kv_ptr.dtype.element_ty), mask=mask)
        tl.store(kv_ptr + stride_kv + dst, v.to(kv_ptr.dtype.element_ty), mask=mask)


def kv_write(
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    k: torch.Tensor,  # [T, Hkv, D]
    v: torch.Tensor,  # [T, Hkv, D]
    slots: torch.Tensor,  # [T] int64: block * block_size + offset, < 0 to skip
) -> None:
    T, H, D = k.shape
    _, two, block_size, Hc, Dc = kv_cache.shape
    check(two == 2 and (Hc, Dc) == (H, D), lambda: f"kv_cache {tuple(kv_cache.shape)} vs k {k.shape}")
    check(v.shape == k.shape, "k and v: same shape")
    check(slots.dtype == torch.int64 and slots.shape[0] >= T and slots.is_contiguous(),
          "slots: contiguous int64 [T]")
    for name, t in (("k", k), ("v", v), ("kv_cache", kv_cache)):
        check_last_dim_contiguous(name, t)
    if T == 0:
        return
    H_PAD, D_PAD = next_pow2(H), next_pow2(D)
    _kv_write_kernel[(T,)](
        k, k.stride(0), k.stride(1),
        v, v.stride(0), v.stride(1),
        kv_cache, kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        slots,
        H=H, H_PAD=H_PAD, HEAD_DIM=D, D_PAD=D_PAD, BLOCK_SIZE=block_size,
        num_warps=4 if H_PAD * D_PAD >= 1024 else 1,
    )


def kv_write_ref(
    kv_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor
) -> None:
    """Pure torch: the CPU path and the oracle."""
    keep = slots[: k.shape[0]] >= 0
    slots = slots[: k.shape[0]][keep]
    block_size = kv_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    kv_cache[blocks, 0, offsets] = k[keep].to(kv_cache.dtype)
    kv_cache[blocks, 1, offsets] = v[keep].to(kv_cache.dtype)
