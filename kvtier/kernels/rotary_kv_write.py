"""Rotary on q and k, and the KV write, in one launch: what `rotary` then `kv_write` do.

Apart, the rotary kernel writes the rotated k to a fresh tensor that `kv_write` reads back to
store it into its paged slot: two launches a layer and a round trip of k, which at the tail of a
batch (a few requests) is mostly launch latency
(results/offline/profile_offline_decode_h200_skip850_5b122b0.json). Here one program a token
reads the token's cos/sin row once, rotates its q heads into `q_out` and its k heads straight
into the cache, and copies v there. Fused is shorter than apart at every token count of a
llama-3.1-8b layer, from launch-bound tails to bandwidth-bound prefills
(results/kernels/kernels_argmax_rotary_kv_write_h200_d41cae2.json,
`python -m benchmarks.kernels.bench_kernels --parts rotary_kv_write`).

Same math and rounding as `rotary` (fp32, one rounding), so the stored K and the rotated q
are bit for bit those of the two kernels. Rows at or past `num_kv_tokens`, or with a negative
slot, write nothing to the cache; their q is still rotated (like `rotary`'s).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.kv_write import kv_write_ref
from kvtier.kernels.launch import check, check_last_dim_contiguous, next_pow2
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel
from kvtier.kernels.rotary import rotary_ref, rotate_heads, token_cos_sin


@triton.jit(do_not_specialize=["num_kv_tokens"])  # one compile whatever the batch size
def _rotary_kv_write_kernel(
    q_ptr, stride_qt, stride_qh, qo_ptr, stride_qot, stride_qoh,  # [T, Hq, D]
    k_ptr, stride_kt, stride_kh, v_ptr, stride_vt, stride_vh,  # [T, Hkv, D]
    kv_ptr, stride_block, stride_kv, stride_tok, stride_head,  # [nb, 2, bs, Hkv, D]
    slots_ptr, num_kv_tokens,  # [>= num_kv_tokens] int64
    pos_ptr, cache_ptr, stride_cache,  # [T], [max_pos, D] fp32
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HK: tl.constexpr, HK_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    t = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HALF_PAD)
    cos, sin = token_cos_sin(pos_ptr, cache_ptr, stride_cache, t, half, HALF)
    rotate_heads(q_ptr, qo_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, t, cos, sin,
                 half, HQ, HQ_PAD, HALF, HALF_PAD)
    if t < num_kv_tokens:
        slot = tl.load(slots_ptr + t)
        if slot >= 0:
            row = (slot // BLOCK_SIZE) * stride_block + (slot % BLOCK_SIZE) * stride_tok
            # k: rotated straight into its K row (a destination row stride of 0: one token)
            rotate_heads(k_ptr, kv_ptr + row, stride_kt, stride_kh, 0, stride_head, t, cos,
                         sin, half, HK, HK_PAD, HALF, HALF_PAD)
            h = tl.arange(0, HK_PAD)
            d = tl.arange(0, 2 * HALF_PAD)
            mask = (h < HK)[:, None] & (d < 2 * HALF)[None, :]
            # v: no arithmetic, so bf16 passes through untouched (also in the interpreter)
            v = tl.load(v_ptr + t * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
            tl.store(kv_ptr + stride_kv + row + h[:, None] * stride_head + d[None, :],
                     v.to(kv_ptr.dtype.element_ty), mask=mask)


def rotary_kv_write(
    q: torch.Tensor,  # [T, Hq, D], unrotated
    k: torch.Tensor,  # [T, Hkv, D], unrotated
    v: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int32/int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    slots: torch.Tensor,  # [>= num_kv_tokens] int64: block * block_size + offset, < 0 skips
    num_kv_tokens: int | None = None,  # rows whose K/V are stored; None: all T
    q_out: torch.Tensor | None = None,  # [T, Hq, D]; None: allocated (q itself is fine)
) -> torch.Tensor:
    """Stores rotated k and v of the first `num_kv_tokens` rows at their slots; returns the
    rotated q (`q_out`)."""
    T, Hq, D = q.shape
    _, two, block_size, Hk, Dc = kv_cache.shape
    check(k.dim() == 3 and k.shape[0] == T and (k.shape[1], k.shape[2]) == (Hk, D),
          lambda: f"k {k.shape} vs q {q.shape}, kv_cache {tuple(kv_cache.shape)}")
    check(two == 2 and Dc == D, lambda: f"kv_cache {tuple(kv_cache.shape)} vs q {q.shape}")
    check(v.shape == k.shape, "k and v: same shape")
    check(k.dtype == kv_cache.dtype, lambda: f"dtype mismatch: k {k.dtype}, kv {kv_cache.dtype}")
    check(D % 2 == 0 and cos_sin_cache.shape[1] == D, lambda: f"cos_sin_cache must be [max_pos, {D}]")
    check(cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1,
          "cos_sin_cache: fp32, rows contiguous")
    check(positions.shape == (T,) and positions.is_contiguous(), "positions: contiguous [T]")
    n = T if num_kv_tokens is None else num_kv_tokens
    check(0 <= n <= T, lambda: f"num_kv_tokens {n} outside [0, {T}]")
    check(slots.dtype == torch.int64 and slots.shape[0] >= n and slots.is_contiguous(),
          "slots: contiguous int64 [num_kv_tokens]")
    q_out = torch.empty_like(q) if q_out is None else q_out
    check(q_out.shape == q.shape, "q_out: the shape of q")
    for name, t in (("q", q), ("k", k), ("v", v), ("kv_cache", kv_cache), ("q_out", q_out)):
        check_last_dim_contiguous(name, t)
    if T == 0:
        return q_out
    _rotary_kv_write_kernel[(T,)](
        q, q.stride(0), q.stride(1), q_out, q_out.stride(0), q_out.stride(1),
        k, k.stride(0), k.stride(1), v, v.stride(0), v.stride(1),
        kv_cache, kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        slots, n, positions, cos_sin_cache, cos_sin_cache.stride(0),
        HQ=Hq, HQ_PAD=next_pow2(Hq), HK=Hk, HK_PAD=next_pow2(Hk),
        HALF=D // 2, HALF_PAD=next_pow2(D // 2), BLOCK_SIZE=block_size,
        num_warps=4, **pdl_launch(q.device),
    )
    return q_out


def rotary_kv_write_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
    cos_sin_cache: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor,
    num_kv_tokens: int | None = None,
) -> torch.Tensor:
    """Pure torch: `rotary_ref`, then `kv_write_ref` of the first num_kv_tokens rows."""
    n = q.shape[0] if num_kv_tokens is None else num_kv_tokens
    q_rot, k_rot = rotary_ref(q, k, positions, cos_sin_cache)
    kv_write_ref(kv_cache, k_rot[:n], v[:n], slots[:n])
    return q_rot
