"""Neox-style rotary embedding (rotate halves, as HF Llama/Qwen) on q and k in one launch.

cos_sin_cache format: [max_pos, D] float32, row p = [cos(p * inv_freq), sin(p * inv_freq)]
with inv_freq of length D/2 (the same table `kvtier.model.rope.cos_sin_cache` builds). For
x = [x1, x2] (halves of head_dim):

    out1 = x1 * cos - x2 * sin
    out2 = x2 * cos + x1 * sin

computed in fp32 and rounded once (HF rounds after each bf16 op; the difference is within
bf16 tolerance, and fp32 agrees to ~1e-7).

One program per token: it reads the token's cos/sin row once and rotates all Hq + Hkv heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, next_pow2


@triton.jit
def token_cos_sin(pos_ptr, cache_ptr, stride_cache, t, half, HALF: tl.constexpr):
    """Token t's cos and sin rows ([1, HALF_PAD] each) at its position."""
    p = tl.load(pos_ptr + t).to(tl.int64)
    cos = tl.load(cache_ptr + p * stride_cache + half, mask=half < HALF, other=0.0)[None, :]
    sin = tl.load(cache_ptr + p * stride_cache + HALF + half, mask=half < HALF,
                  other=0.0)[None, :]
    return cos, sin


@triton.jit
def rotate_heads(src_ptr, dst_ptr, stride_st, stride_sh, stride_dt, stride_dh, t, cos, sin, half,
                 H: tl.constexpr, H_PAD: tl.constexpr, HALF: tl.constexpr,
                 HALF_PAD: tl.constexpr):
    h = tl.arange(0, H_PAD)
    mask = (h < H)[:, None] & (half < HALF)[None, :]
    src = src_ptr + t * stride_st + h[:, None] * stride_sh + half[None, :]
    dst = dst_ptr + t * stride_dt + h[:, None] * stride_dh + half[None, :]
    x1 = tl.load(src, mask=mask, other=0.0)
    x2 = tl.load(src + HALF, mask=mask, other=0.0)
    a = x1.to(tl.float32)
    b = x2.to(tl.float32)
    tl.store(dst, (a * cos - b * sin).to(x1.dtype), mask=mask)
    tl.store(dst + HALF, (b * cos + a * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr, stride_qt, stride_qh, k_ptr, stride_kt, stride_kh,  # inputs [T, H, D]
    qo_ptr, stride_qot, stride_qoh, ko_ptr, stride_kot, stride_koh,  # outputs (may alias)
    pos_ptr, cache_ptr, stride_cache,  # [T], [max_pos, D]
    HQ: tl.constexpr, HQ_PAD: tl.constexpr, HK: tl.constexpr, HK_PAD: tl.constexpr,
    HALF: tl.constexpr, HALF_PAD: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    half = tl.arange(0, HALF_PAD)
    cos, sin = token_cos_sin(pos_ptr, cache_ptr, stride_cache, t, half, HALF)
    rotate_heads(q_ptr, qo_ptr, stride_qt, stride_qh, stride_qot, stride_qoh, t, cos, sin,
                 half, HQ, HQ_PAD, HALF, HALF_PAD)
    rotate_heads(k_ptr, ko_ptr, stride_kt, stride_kh, stride_kot, stride_koh, t, cos, sin,
                 half, HK, HK_PAD, HALF, HALF_PAD)


def rotary(
    q: torch.Tensor,  # [T, Hq, D]
    k: torch.Tensor,  # [T, Hkv, D]
    positions: torch.Tensor,  # [T] int32/int64
    cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32: cos in [:, :D/2], sin in [:, D/2:]
    *,
    inplace: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns rotated (q, k); with inplace=True they are q and k themselves (strided views,
    e.g. of a fused qkv output, are fine)."""
    T, Hq, D = q.shape
    check(k.dim() == 3 and k.shape[0] == T and k.shape[2] == D, lambda: f"k {k.shape} vs q {q.shape}")
    check(D % 2 == 0 and cos_sin_cache.shape[1] == D, lambda: f"cos_sin_cache must be [max_pos, {D}]")
    check(cos_sin_cache.dtype == torch.float32 and cos_sin_cache.stride(1) == 1,
          "cos_sin_cache: fp32, rows contiguous")
    check(positions.shape == (T,) and positions.is_contiguous(), "positions: contiguous [T]")
    check(q.stride(-1) == 1 and k.stride(-1) == 1, "q, k: last dim must be contiguous")
    qo = q if inplace else torch.empty_like(q)
    ko = k if inplace else torch.empty_like(k)
    if T == 0:
        return qo, ko
    Hk = k.shape[1]
    _rotary_kernel[(T,)](
        q, q.stride(0), q.stride(1), k, k.stride(0), k.stride(1),
        qo, qo.stride(0), qo.stride(1), ko, ko.stride(0), ko.stride(1),
        positions, cos_sin_cache, cos_sin_cache.stride(0),
        HQ=Hq, HQ_PAD=next_pow2(Hq), HK=Hk, HK_PAD=next_pow2(Hk),
        HALF=D // 2, HALF_PAD=next_pow2(D // 2),
        num_warps=4,
    )
    return qo, ko


def rotary_ref(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure torch, fp32 math, one rounding: the oracle."""
    cos, sin = cos_sin_cache[positions.long()].chunk(2, dim=-1)  # [T, D/2] each
    cos, sin = cos[:, None], sin[:, None]

    def rot(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)

    return rot(q), rot(k)
