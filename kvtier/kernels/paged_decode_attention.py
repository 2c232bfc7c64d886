"""Split-K (flash-decoding) attention for decode rows: one query token per request, over the
layer-granular paged KV layout, plus an optional dense prefix segment (a dropped prefix's KV, recomputed).

Work split: one program per (request, KV head, split). A program loads each K/V tile once and
uses it for all G = Hq/Hkv query heads of its group (q heads padded to 16 rows so `tl.dot`
runs on tensor cores: decode is memory-bound, the padding costs no bandwidth). When batch x
KV heads is too small to fill the SMs, each request's context is cut into `num_splits`
ranges; every program writes a partial output and its log-sum-exp, and `_reduce_splits`
merges them. A CUDA graph fixes `num_splits` for its batch size at capture (from
max_model_len), so each request caps its own split count by its length: a request gets
min(num_splits, seq_len // min_split_tokens) splits (at least one), a single-split request
writes its output directly, and the programs past its count exit at once. Short requests
in a graph captured for long ones then pay no partial outputs and no reduce. The launch
shape (tiles, split counts) is paged_decode_launch.py's.

Launch order: KV heads vary fastest, and a single-split launch may take `order`, the
requests in the order their programs start. Served batches mix a few long contexts among
many short ones; started longest first, the long ones no longer trail the last wave (with
the head-fastest grid, a shorter kernel on the offline ShareGPT run's contexts,
results/kernels/kernels_sharegpt_context_h200_{base,order}_{1,2}.json).

Context of request b (absolute token positions):

    [0, prefix_len_b)          dense prefix:  prefix.k/v rows start_loc[b] .. start_loc[b+1]
    [prefix_len_b, seq_len_b)  paged:         block_tables[b, pos // block_size], pos absolute

so a request whose first `s` tokens are recomputed keeps its block table indexed by absolute
position (the first pages are simply never read). Without a prefix, prefix_len_b = 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvtier.kernels.attention_sources import (
    load_dense_kv_tile,
    load_paged_kv_tile,
    online_softmax_update,
)
from kvtier.kernels.launch import (
    check,
    check_last_dim_contiguous,
    dot_precision,
    next_pow2,
    num_sms,
    upcast,
)
from kvtier.kernels.paged_decode_launch import (
    choose_num_splits,
    default_min_split_tokens,
    programs_per_sm,
    tiles_for,
)
from kvtier.kernels.pdl import pdl_launch, wait_for_previous_kernel

LOG2E = 1.4426950408889634


@dataclass
class DenseSegment:
    """KV rows that are not in the paged pool, e.g. a prefix recomputed this step.

    Request b owns rows start_loc[b] .. start_loc[b+1] of k and v, at positions 0.. of its
    context."""

    k: torch.Tensor  # [num_rows, Hkv, D]
    v: torch.Tensor  # [num_rows, Hkv, D]
    start_loc: torch.Tensor  # [B + 1] int32


@triton.jit
def request_splits(seq_len, num_splits, min_split_tokens):
    """Splits of one request: num_splits, fewer where its ranges would be shorter than
    min_split_tokens, at least one."""
    return tl.minimum(tl.maximum(seq_len // min_split_tokens, 1), num_splits)


@triton.jit
def decode_split(
    b, kv_head, split, num_kv_heads,  # which (request, KV head, split); Hkv
    q_ptr, stride_qb, stride_qh,  # [B, Hq, D]
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
    block_tables_ptr, stride_bt,  # [B, max_blocks]
    seq_lens_ptr,  # [B]
    pk_ptr, pv_ptr, stride_p_tok, stride_p_head, prefix_loc_ptr,  # dense prefix (optional)
    out_ptr, stride_ob, stride_oh,  # [B, Hq, D] (SINGLE_SPLIT)
    part_ptr, lse_ptr,  # [B, Hq, num_splits, D] fp32, [B, Hq, num_splits] fp32
    qk_scale, num_splits, min_split_tokens,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_PREFIX: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """One (request, KV head, split) of the decode: the body of `_decode_split_kernel`, shared
    with the horizontally fused kernel (benchmarks/experiments/kernels/fused_attention.py)."""
    seq_len = tl.load(seq_lens_ptr + b)
    # Each request cuts its own context into its own number of tile-aligned ranges: the grid
    # depends only on (B, Hkv, num_splits), so a captured CUDA graph stays valid as lengths
    # grow. A split past the request's count exits before loading anything more.
    splits = request_splits(seq_len, num_splits, min_split_tokens)
    if split < splits:
        part = tl.cdiv(tl.cdiv(seq_len, splits), BLOCK_N) * BLOCK_N
        lo = split * part
        decode_range(
            b, kv_head, split, splits, num_kv_heads, lo, tl.minimum(lo + part, seq_len),
            q_ptr, stride_qb, stride_qh,
            kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
            block_tables_ptr, stride_bt,
            pk_ptr, pv_ptr, stride_p_tok, stride_p_head, prefix_loc_ptr,
            out_ptr, stride_ob, stride_oh, part_ptr, lse_ptr, qk_scale, num_splits,
            G, G_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_N, SINGLE_SPLIT, HAS_PREFIX, UPCAST,
            PRECISION,
        )


@triton.jit
def decode_range(
    b, kv_head, split, splits, num_kv_heads, lo, hi,  # context positions [lo, hi)
    q_ptr, stride_qb, stride_qh,
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
    block_tables_ptr, stride_bt,
    pk_ptr, pv_ptr, stride_p_tok, stride_p_head, prefix_loc_ptr,
    out_ptr, stride_ob, stride_oh, part_ptr, lse_ptr, qk_scale, num_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_PREFIX: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """Split `split` (of the request's `splits`) over positions [lo, hi): its output, or its
    partial output and log-sum-exp."""
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    g_ok = g < G
    d_ok = d < HEAD_DIM
    heads = kv_head * G + g
    q = tl.load(
        q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
        mask=g_ok[:, None] & d_ok[None, :], other=0.0,
    )  # [G_PAD, D_PAD]
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    n = tl.arange(0, BLOCK_N)

    paged_lo = lo
    if HAS_PREFIX:  # source 1: dense prefix, positions [0, prefix_len)
        row0 = tl.load(prefix_loc_ptr + b)
        prefix_len = tl.load(prefix_loc_ptr + b + 1) - row0
        pk = pk_ptr + row0.to(tl.int64) * stride_p_tok
        pv = pv_ptr + row0.to(tl.int64) * stride_p_tok
        end = tl.minimum(hi, prefix_len)
        for start in range(lo, end, BLOCK_N):
            pos = start + n
            valid = pos < end
            k, v = load_dense_kv_tile(pk, pv, pos, valid, d, d_ok, kv_head,
                                      stride_p_tok, stride_p_head, UPCAST)
            m, l_i, acc = online_softmax_update(q, k, v, m, l_i, acc, valid[None, :], qk_scale,
                                              PRECISION)
        paged_lo = tl.maximum(lo, prefix_len)

    # source 2: paged pool, positions [prefix_len, seq_len)
    bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
    for start in range(paged_lo, hi, BLOCK_N):
        pos = start + n
        valid = pos < hi
        k, v = load_paged_kv_tile(kv_ptr, bt_row, pos, valid, d, d_ok, kv_head,
                                  stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
                                  BLOCK_SIZE, UPCAST)
        m, l_i, acc = online_softmax_update(q, k, v, m, l_i, acc, valid[None, :], qk_scale,
                                          PRECISION)

    write_split(m, l_i, acc, b, heads, g_ok, d, d_ok, split, splits, num_kv_heads, num_splits,
                out_ptr, stride_ob, stride_oh, part_ptr, lse_ptr, G, HEAD_DIM, SINGLE_SPLIT)


@triton.jit
def write_split(
    m, l_i, acc, b, heads, g_ok, d, d_ok, split, splits, num_kv_heads, num_splits,
    out_ptr, stride_ob, stride_oh, part_ptr, lse_ptr,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
):
    """A split's result: the output of a request it covers alone, else its partial output
    and log-sum-exp for the reduce."""
    # A split of a request's own count that saw no tokens (possible where tile rounding
    # leaves the last range empty): l_i = 0, lse = -inf, weight 0 in the reduce.
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    w_mask = g_ok[:, None] & d_ok[None, :]
    dst = out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :]
    if SINGLE_SPLIT:
        tl.store(dst, o.to(out_ptr.dtype.element_ty), mask=w_mask)
    else:
        # A one-split request is done here; the reduce leaves its rows alone.
        tl.store(dst, o.to(out_ptr.dtype.element_ty),
                 mask=w_mask & ((splits == 1) & (split == 0)))
        mine = splits > 1
        row = (b * (G * num_kv_heads) + heads) * num_splits + split  # [G_PAD]
        tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=w_mask & mine)
        tl.store(lse_ptr + row, tl.where(has, m + tl.log2(tl.where(has, l_i, 1.0)),
                                         float("-inf")), mask=g_ok & mine)


# Values that change from step to step are runtime arguments and never specialized on, so
# the eager path compiles each kernel once instead of once per (splits, table width) seen.
@triton.jit(do_not_specialize=["stride_bt", "num_splits", "min_split_tokens"])
def _decode_split_kernel(
    order_ptr,  # [B] int32: the request each row of programs serves (HAS_ORDER)
    q_ptr, stride_qb, stride_qh,  # [B, Hq, D]
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
    block_tables_ptr, stride_bt,  # [B, max_blocks]
    seq_lens_ptr,  # [B]
    pk_ptr, pv_ptr, stride_p_tok, stride_p_head, prefix_loc_ptr,  # dense prefix (optional)
    out_ptr, stride_ob, stride_oh,  # [B, Hq, D] (SINGLE_SPLIT)
    part_ptr, lse_ptr,  # [B, Hq, num_splits, D] fp32, [B, Hq, num_splits] fp32
    qk_scale, num_splits, min_split_tokens,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    HAS_PREFIX: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    HAS_ORDER: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    # KV heads vary fastest: a request's programs start together (they read interleaved
    # slices of the same blocks), and programs start in `order`, so a batch ordered longest
    # first starts its longest contexts in the first wave instead of leaving them to the
    # last one (the hardware issues programs roughly in id order).
    b = tl.program_id(1)
    if HAS_ORDER:
        b = tl.load(order_ptr + b)
    decode_split(
        b, tl.program_id(0), tl.program_id(2), tl.num_programs(0),
        q_ptr, stride_qb, stride_qh,
        kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
        block_tables_ptr, stride_bt, seq_lens_ptr,
        pk_ptr, pv_ptr, stride_p_tok, stride_p_head, prefix_loc_ptr,
        out_ptr, stride_ob, stride_oh, part_ptr, lse_ptr, qk_scale, num_splits,
        min_split_tokens, G, G_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_N, SINGLE_SPLIT,
        HAS_PREFIX, UPCAST, PRECISION,
    )


@triton.jit(do_not_specialize=["num_splits", "min_split_tokens"])
def _reduce_splits_kernel(
    part_ptr, lse_ptr,  # [B, Hq, num_splits, D] fp32, [B, Hq, num_splits] fp32 (log2 domain)
    out_ptr, stride_ob, stride_oh,  # [B, Hq, D]
    seq_lens_ptr, num_splits, min_split_tokens,
    S_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, USE_PDL: tl.constexpr,
):
    wait_for_previous_kernel(USE_PDL)
    b = tl.program_id(0)
    h = tl.program_id(1)
    splits = request_splits(tl.load(seq_lens_ptr + b), num_splits, min_split_tokens)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    row = (b * tl.num_programs(1) + h) * num_splits + s  # [S_PAD]
    mine = (s < splits) & (splits > 1)  # a one-split request's output is written already
    lse = tl.load(lse_ptr + row, mask=mine, other=float("-inf"))
    # A split request's split 0 always has tokens: its max is finite and its weights sum
    # to >= 1. A one-split request's row is all -inf; the guards keep its (unstored)
    # arithmetic finite.
    top = tl.where(splits > 1, tl.max(lse, 0), 0.0)
    w = tl.exp2(lse - top)
    o = tl.load(part_ptr + row[:, None] * HEAD_DIM + d[None, :],
                mask=mine[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    res = tl.sum(w[:, None] * o, 0) / tl.maximum(tl.sum(w, 0), 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty),
             mask=(d < HEAD_DIM) & (splits > 1))



def check_decode_args(
    q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, out: torch.Tensor | None, prefix: DenseSegment | None,
) -> torch.Tensor:
    """Shape, dtype and stride checks of a decode problem; returns `out`, allocated if None."""
    B, Hq, D = q.shape
    _, two, block_size, Hkv, Dk = kv_cache.shape
    check(two == 2 and Dk == D, lambda: f"kv_cache {tuple(kv_cache.shape)} does not match q {q.shape}")
    check(Hq % Hkv == 0, lambda: f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    check(block_tables.dim() == 2 and block_tables.shape[0] >= B, "block_tables: [B, max_blocks]")
    check(block_tables.dtype == torch.int32 and seq_lens.dtype == torch.int32,
          "block_tables and seq_lens must be int32")
    check(seq_lens.shape[0] >= B and seq_lens.is_contiguous(), "seq_lens: contiguous [B]")
    check(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    check(kv_cache.dtype == q.dtype, lambda: f"dtype mismatch: q {q.dtype}, kv {kv_cache.dtype}")
    for name, t in (("q", q), ("kv_cache", kv_cache)):
        check_last_dim_contiguous(name, t)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(-1) == 1, "out: [B, Hq, D], last dim contiguous")
    if prefix is not None:
        check(prefix.k.shape[1:] == (Hkv, D) and prefix.v.shape == prefix.k.shape,
              "prefix k/v: [rows, Hkv, D]")
        check(prefix.k.stride() == prefix.v.stride() and prefix.k.stride(-1) == 1,
              "prefix k and v need equal strides, last dim contiguous")
        check(prefix.k.dtype == q.dtype and prefix.start_loc.dtype == torch.int32,
              "prefix: same dtype as q, int32 start_loc")
    return out


def split_partials(out: torch.Tensor, num_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 partial outputs [B, Hq, num_splits, D] and their log2-sum-exp [B, Hq, num_splits];
    with one split the kernel writes `out` directly and these are placeholders."""
    if num_splits == 1:
        return out, out
    B, Hq, D = out.shape
    part = torch.empty(B, Hq, num_splits, D, dtype=torch.float32, device=out.device)
    lse = torch.empty(B, Hq, num_splits, dtype=torch.float32, device=out.device)
    return part, lse


def reduce_splits(part: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
                  seq_lens: torch.Tensor, min_split_tokens: int) -> None:
    """Merges the splits' partial outputs into `out` [B, Hq, D] (one small launch), for the
    requests that had more than one split."""
    B, Hq, num_splits, D = part.shape
    _reduce_splits_kernel[(B, Hq)](
        part, lse, out, out.stride(0), out.stride(1), seq_lens, num_splits, min_split_tokens,
        S_PAD=next_pow2(num_splits), HEAD_DIM=D, D_PAD=next_pow2(D), num_warps=4,
        **pdl_launch(out.device),
    )


def launch_order(order: torch.Tensor | None, batch: int,
                 num_splits: int) -> torch.Tensor | None:
    """The request order a launch takes (None: the batch's own)."""
    if order is None:
        return None
    check(order.dtype == torch.int32 and order.shape[0] >= batch,
          lambda: f"order must be int32 with at least {batch} entries")
    # Split launches already cut long contexts, and read through the index they ran
    # slower on the H200 (results/kernels/kernels_grid_order_h200.json): the order serves
    # single-split launches only.
    return order if num_splits == 1 else None


def paged_decode_attention(
    q: torch.Tensor,  # [B, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    block_tables: torch.Tensor,  # [B, max_blocks] int32
    seq_lens: torch.Tensor,  # [B] int32, whole context incl. the new token and any prefix
    scale: float,
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D]
    max_seq_len: int | None = None,  # host bound on seq_lens (reading it would sync)
    num_splits: int | None = None,  # fixed for CUDA graphs; else chosen from the shape
    prefix: DenseSegment | None = None,
    block_n: int | None = None,  # tile and launch shape: `default_tiles` where None
    num_warps: int | None = None,
    num_stages: int | None = None,
    min_split_tokens: int | None = None,  # ranges at least this long; None: by batch size
    order: torch.Tensor | None = None,  # [B] int32 permutation: requests in launch order
) -> torch.Tensor:  # [B, Hq, D]
    B, Hq, D = q.shape
    block_size, Hkv = kv_cache.shape[2], kv_cache.shape[3]
    out = check_decode_args(q, kv_cache, block_tables, seq_lens, out, prefix)
    if B == 0:
        return out
    tiles = tiles_for(q, kv_cache)
    block_n = block_n or tiles.block_n
    num_warps = num_warps or tiles.num_warps
    num_stages = num_stages or tiles.num_stages
    if num_splits is None:
        if max_seq_len is None:
            max_seq_len = int(seq_lens[:B].max())  # syncs; callers on the hot path pass it
        num_splits = choose_num_splits(q, kv_cache, max_seq_len, block_n, num_stages)
    if min_split_tokens is None:
        per_sm = programs_per_sm(block_n, D, q.element_size(), num_stages)
        min_split_tokens = default_min_split_tokens(B, Hkv, num_sms(q.device), per_sm)
    G = Hq // Hkv
    D_PAD = next_pow2(D)
    part, lse = split_partials(out, num_splits)
    pk = prefix.k if prefix is not None else q
    pv = prefix.v if prefix is not None else q
    ploc = prefix.start_loc if prefix is not None else seq_lens
    order = launch_order(order, B, num_splits)
    _decode_split_kernel[(Hkv, B, num_splits)](  # KV heads fastest
        order if order is not None else seq_lens,
        q, q.stride(0), q.stride(1),
        kv_cache, kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables, block_tables.stride(0),
        seq_lens,
        pk, pv, pk.stride(0), pk.stride(1), ploc,
        out, out.stride(0), out.stride(1),
        part, lse,
        scale * LOG2E, num_splits, min_split_tokens,
        G=G, G_PAD=max(16, next_pow2(G)), HEAD_DIM=D, D_PAD=D_PAD,
        BLOCK_SIZE=block_size, BLOCK_N=block_n, SINGLE_SPLIT=num_splits == 1,
        HAS_PREFIX=prefix is not None, UPCAST=upcast(q.dtype), PRECISION=dot_precision(q.dtype),
        HAS_ORDER=order is not None, num_warps=num_warps, num_stages=num_stages,
        **pdl_launch(q.device),
    )
    if num_splits > 1:
        reduce_splits(part, lse, out, seq_lens, min_split_tokens)
    return out


def paged_decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [B, max_blocks]
    seq_lens: torch.Tensor,  # [B]
    scale: float,
    prefix: DenseSegment | None = None,
) -> torch.Tensor:  # [B, Hq, D]
    """Pure torch, fp32 math: the CPU path and the oracle."""
    B, Hq, D = q.shape
    bs, Hkv = kv_cache.shape[2], kv_cache.shape[3]
    out = torch.empty_like(q)
    for b in range(B):
        seq_len = int(seq_lens[b])
        p0, p1 = (int(prefix.start_loc[b]), int(prefix.start_loc[b + 1])) if prefix else (0, 0)
        pos = torch.arange(p1 - p0, seq_len, device=q.device)
        blocks = block_tables[b, pos // bs].long()
        k = kv_cache[blocks, 0, pos % bs]  # [n, Hkv, D]
        v = kv_cache[blocks, 1, pos % bs]
        if prefix is not None:
            k = torch.cat((prefix.k[p0:p1], k))
            v = torch.cat((prefix.v[p0:p1], v))
        k = k.float().repeat_interleave(Hq // Hkv, dim=1)  # [seq_len, Hq, D]
        v = v.float().repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("hd,nhd->hn", q[b].float(), k) * scale
        out[b] = torch.einsum("hn,nhd->hd", s.softmax(-1), v).to(q.dtype)
    return out
