"""Zero-copy decode attention over KV pages in pinned host memory: a
Triton split-KV kernel reads each K/V tile straight from the host page through its UVA
address, with no staging buffer and no swap-in.

Host layout, per layer, for K and V alike (the same as kvtier/kernels/cpu_attention.py's):

    pages[num_pages, num_kv_heads, page_size, head_dim]   bf16 or fp32, pinned

The page, head and row strides are free (K and V may be views of one buffer); rows are
contiguous. Token t of request b is row t % page_size of page block_tables[b, t // page_size];
positions >= context_lens[b] are never read. Query head i belongs to KV head i // (Hq // Hkv).

Contract (that of `cpu_decode_attention`): the output [B, Hq, D] and the natural-log LSE
[B, Hq] fp32 per (request, head), so a caller merges this partial attention with the one over
GPU-resident blocks by logaddexp; an empty context gives output 0 and LSE -inf. The pages
may also be on q's GPU (the device pool's layer view, for the GPU-resident part of a row whose
oldest blocks are on the host): the kernel reads them as it reads any address.

Work split ("CPU-aware tiling"): one program per (KV head, request, split). A program owns one
KV head and walks its range of the request's context BLOCK_N tokens at a time (whole pages for
page_size <= BLOCK_N); each K/V tile crosses PCIe once and serves all G = Hq / Hkv query heads
of the group (padded to 16 rows for `tl.dot`). Every split writes a partial output and its
log2-sum-exp to a workspace; `_merge_splits_kernel` merges them and writes the natural LSE.

Why splits: the host read is latency-bound per program (a PCIe read takes far longer than an
HBM one), so the launch needs enough programs resident to keep many reads outstanding;
`default_num_splits` cuts each request until the grid fills the SMs' resident slots.

How the host pointer gets to the kernel (as in kvtier/kernels/host_page_io.py): the pinned CPU
tensor is passed as is; Triton's launcher asks the driver for the device address of every
pointer argument, which for page-locked memory under UVA is valid. A CUDA graph captures that
address: the pages must stay at their addresses between replays (a preallocated pool does).
Capturable: no host sync (the split count comes from the block table's width, a host bound on
every context), and nothing is allocated when `out`, `lse` and `workspace` are given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvtier.kernels.attention_sources import online_softmax_update
from kvtier.kernels.launch import (
    check,
    check_last_dim_contiguous,
    dot_precision,
    next_pow2,
    num_sms,
    upcast,
)
from kvtier.kernels.paged_decode_launch import programs_per_sm

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
DTYPES = (torch.bfloat16, torch.float32)
MAX_SPLITS = 64
# Host tiles are read once: out of L2 first (it holds the GPU-resident attention's KV and
# the forward's weights). An eviction priority only: PTX's ld takes no cache operator beside
# it. Where Triton pipelines the loads into cp.async.cg (L2 only, past L1; checked by
# tests/kernels/test_host_decode_attention_sm90.py) the priority is dropped.
LOAD_EVICTION_POLICY: tl.constexpr = tl.constexpr("evict_first")


@dataclass(frozen=True)
class HostDecodeLaunch:
    """Launch shape: tokens per K/V tile, warps, pipeline stages (cp.async depth)."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3


def default_launch(dtype: torch.dtype) -> HostDecodeLaunch:
    # 64 tokens x 128 dims x 2 B = 16 KiB a K tile, 4 pages of 16; fp32 halves the tile so
    # three stages still fit shared memory twice an SM.
    return HostDecodeLaunch(block_n=32 if dtype == torch.float32 else 64)


def default_num_splits(batch: int, num_kv_heads: int, max_context: int, sms: int,
                       per_sm: int, block_n: int) -> int:
    """Splits per request so that the (KV head, request, split) programs fill every resident
    slot once (each keeps its own reads in flight), never more splits than tiles of the
    longest possible context, at most MAX_SPLITS."""
    programs = max(1, batch * num_kv_heads)
    slots = sms * per_sm
    tiles = max(1, -(-max_context // block_n))
    return max(1, min(MAX_SPLITS, tiles, -(-slots // programs)))


@dataclass(frozen=True)
class HostDecodeWorkspace:
    """Split partials: outputs [B, Hq, S, D] fp32 and their log2-sum-exp [B, Hq, S] fp32."""

    part: torch.Tensor
    part_lse: torch.Tensor

    @staticmethod
    def allocate(batch: int, num_heads: int, head_dim: int, num_splits: int,
                 device: torch.device) -> HostDecodeWorkspace:
        return HostDecodeWorkspace(
            torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32,
                        device=device),
            torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=device))

    def fits(self, batch: int, num_heads: int, head_dim: int, num_splits: int) -> bool:
        return (tuple(self.part.shape) == (batch, num_heads, num_splits, head_dim)
                and tuple(self.part_lse.shape) == (batch, num_heads, num_splits)
                and self.part.is_contiguous() and self.part_lse.is_contiguous())


@triton.jit
def _load_host_tile(ptr, bt_row, pos, valid, d, d_ok, kv_head, stride_page, stride_head,
                    stride_row, PAGE_SIZE: tl.constexpr, FULL_D: tl.constexpr,
                    UPCAST: tl.constexpr):
    """[BLOCK_N, D_PAD] rows of one KV head at positions `pos` (zero where not valid)."""
    page = tl.load(bt_row + pos // PAGE_SIZE, mask=valid, other=0).to(tl.int64)
    row = page * stride_page + kv_head * stride_head + (pos % PAGE_SIZE) * stride_row
    if FULL_D:  # a row-only mask keeps each lane's 16 B access one vector
        mask = valid[:, None]
    else:
        mask = valid[:, None] & d_ok[None, :]
    x = tl.load(ptr + row[:, None] + d[None, :], mask=mask, other=0.0,
                eviction_policy=LOAD_EVICTION_POLICY)
    if UPCAST:  # the interpreter's bf16 (right after the load)
        x = x.to(tl.float32)
    return x


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])
def _host_decode_kernel(
    q_ptr, stride_qb, stride_qh,  # [B, Hq, D] (GPU)
    k_ptr, stride_kp, stride_kh, stride_kr,  # [num_pages, Hkv, page_size, D] (pinned host)
    v_ptr, stride_vp, stride_vh, stride_vr,
    bt_ptr, stride_bt, lens_ptr,  # [B, max_pages] int32, [B] int32
    out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,  # SINGLE_SPLIT: [B, Hq, D], [B, Hq]
    part_ptr, part_lse_ptr,  # [B, Hq, S, D] fp32, [B, Hq, S] fp32 (log2 domain)
    qk_scale, num_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    kv_head, b, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    ctx = tl.load(lens_ptr + b)
    # Tile-aligned ranges; a split past the context reads nothing and writes an empty partial.
    part = tl.cdiv(tl.cdiv(ctx, num_splits), BLOCK_N) * BLOCK_N
    lo = split * part
    hi = tl.minimum(lo + part, ctx)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    n = tl.arange(0, BLOCK_N)
    g_ok, d_ok = g < G, d < HEAD_DIM
    heads = kv_head * G + g
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + d[None, :],
                mask=g_ok[:, None] & d_ok[None, :], other=0.0)
    q = q.to(tl.float32) if UPCAST else q.to(k_ptr.dtype.element_ty)  # [G_PAD, D_PAD]
    m = tl.full([G_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([G_PAD], tl.float32)
    acc = tl.zeros([G_PAD, D_PAD], tl.float32)
    bt_row = bt_ptr + b.to(tl.int64) * stride_bt
    for start in range(lo, hi, BLOCK_N):
        pos = start + n
        valid = pos < hi
        k = _load_host_tile(k_ptr, bt_row, pos, valid, d, d_ok, kv_head, stride_kp, stride_kh,
                            stride_kr, PAGE_SIZE, D_PAD == HEAD_DIM, UPCAST)
        v = _load_host_tile(v_ptr, bt_row, pos, valid, d, d_ok, kv_head, stride_vp, stride_vh,
                            stride_vr, PAGE_SIZE, D_PAD == HEAD_DIM, UPCAST)
        m, l_i, acc = online_softmax_update(q, k, v, m, l_i, acc, valid[None, :], qk_scale,
                                          PRECISION)
    has = l_i > 0
    o = acc / tl.where(has, l_i, 1.0)[:, None]
    lse2 = tl.where(has, m + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))
    w_mask = g_ok[:, None] & d_ok[None, :]
    if SINGLE_SPLIT:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + d[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=w_mask)
        tl.store(lse_ptr + b * stride_lb + heads, lse2 * 0.6931471805599453, mask=g_ok)
    else:
        row = (b * (G * tl.num_programs(0)) + heads) * num_splits + split  # [G_PAD]
        tl.store(part_ptr + row[:, None] * HEAD_DIM + d[None, :], o, mask=w_mask)
        tl.store(part_lse_ptr + row, lse2, mask=g_ok)


@triton.jit(do_not_specialize=["num_splits"])
def _merge_splits_kernel(
    part_ptr, part_lse_ptr,  # [B, Hq, S, D] fp32, [B, Hq, S] fp32 (log2 domain)
    out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,  # [B, Hq, D], [B, Hq] natural log
    num_splits, S_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
):
    b, h = tl.program_id(0), tl.program_id(1)
    s = tl.arange(0, S_PAD)
    d = tl.arange(0, D_PAD)
    row = (b * tl.num_programs(1) + h) * num_splits + s
    lse2 = tl.load(part_lse_ptr + row, mask=s < num_splits, other=float("-inf"))
    has = lse2 > float("-inf")
    top = tl.max(lse2, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # an empty context: all weights 0
    w = tl.where(has, tl.exp2(lse2 - top), 0.0)
    # Empty splits' partials are never read (their slots may hold anything).
    o = tl.load(part_ptr + row[:, None] * HEAD_DIM + d[None, :],
                mask=has[:, None] & (d < HEAD_DIM)[None, :], other=0.0)
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + d, res.to(out_ptr.dtype.element_ty),
             mask=d < HEAD_DIM)
    lse = tl.where(total > 0, (top + tl.log2(tl.where(total > 0, total, 1.0))) * 0.6931471805599453,
                   float("-inf"))
    tl.store(lse_ptr + b * stride_lb + h, lse)


def _check_inputs(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                  block_tables: torch.Tensor, context_lens: torch.Tensor,
                  need_pinned: bool) -> None:
    check(q.dim() == 3 and q.dtype in DTYPES,
          lambda: f"q must be [B, Hq, D] bf16/fp32, got {tuple(q.shape)} {q.dtype}")
    check(k_pages.dim() == 4 and k_pages.shape == v_pages.shape,
          lambda: f"k_pages and v_pages must both be [num_pages, Hkv, page_size, D], got "
                  f"{tuple(k_pages.shape)} and {tuple(v_pages.shape)}")
    batch, num_heads, head_dim = q.shape
    _, num_kv_heads, page_size, kv_dim = k_pages.shape
    check(kv_dim == head_dim and page_size >= 1,
          lambda: f"head_dim of q ({head_dim}) != of the pages ({kv_dim}), or no page rows")
    check(num_heads % num_kv_heads == 0,
          lambda: f"{num_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    check(k_pages.dtype in DTYPES and v_pages.dtype == k_pages.dtype,
          lambda: f"pages must both be bf16 or fp32, got {k_pages.dtype} and {v_pages.dtype}")
    for name, t in (("q", q), ("k_pages", k_pages), ("v_pages", v_pages)):
        check_last_dim_contiguous(name, t)
    for name, t in (("k_pages", k_pages), ("v_pages", v_pages)):
        if t.device == q.device and t.device.type == "cuda":
            continue  # device pages (a request's device-resident part): read as any pointer
        if t.device.type != "cpu":
            raise ValueError(f"{name} must be in host memory or on q's device, is on {t.device}")
        if need_pinned and q.device.type == "cuda":
            check(t.is_pinned(), f"{name} must be pinned (pin_memory=True): the kernel reads "
                                 "it through its UVA address")
    check(block_tables.dim() == 2 and block_tables.shape[0] == batch
          and block_tables.dtype == torch.int32 and block_tables.stride(1) == 1,
          lambda: f"block_tables must be [B={batch}, max_pages] int32 with contiguous rows, got "
                  f"{tuple(block_tables.shape)} {block_tables.dtype}")
    check(context_lens.shape == (batch,) and context_lens.dtype == torch.int32
          and context_lens.is_contiguous(),
          lambda: f"context_lens must be contiguous [B={batch}] int32, got "
                  f"{tuple(context_lens.shape)} {context_lens.dtype}")


def _outputs(q: torch.Tensor, out: torch.Tensor | None,
             lse: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device) if lse is None else lse
    check(out.shape == q.shape and out.dtype in DTYPES and out.device == q.device
          and out.stride(2) == 1,
          lambda: f"out must be [B, Hq, D] bf16/fp32 on {q.device} with contiguous rows, got "
                  f"{tuple(out.shape)} {out.dtype} on {out.device}")
    check(lse.shape == q.shape[:2] and lse.dtype == torch.float32 and lse.device == q.device
          and lse.stride(1) == 1,
          lambda: f"lse must be [B, Hq] fp32 on {q.device} with contiguous rows, got "
                  f"{tuple(lse.shape)} {lse.dtype} on {lse.device}")
    return out, lse


def choose_num_splits(q: torch.Tensor, k_pages: torch.Tensor, max_pages: int,
                      launch: HostDecodeLaunch | None = None) -> int:
    """The split count `host_decode_attention` takes when given none (a caller capturing a
    graph, or launching every layer alike, computes it once)."""
    launch = launch or default_launch(k_pages.dtype)
    per_sm = programs_per_sm(launch.block_n, q.shape[2], k_pages.element_size(),
                             launch.num_stages)
    return default_num_splits(q.shape[0], k_pages.shape[1], max_pages * k_pages.shape[2],
                              num_sms(q.device), per_sm, launch.block_n)


def host_decode_attention(
    q: torch.Tensor,  # [B, Hq, D] (GPU)
    k_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D] (pinned host)
    v_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D] (pinned host)
    block_tables: torch.Tensor,  # [B, max_pages] int32 (GPU)
    context_lens: torch.Tensor,  # [B] int32 (GPU)
    *,
    out: torch.Tensor | None = None,  # [B, Hq, D]
    lse: torch.Tensor | None = None,  # [B, Hq] fp32
    num_splits: int | None = None,  # None: `choose_num_splits`
    workspace: HostDecodeWorkspace | None = None,  # split partials (allocated if None)
    scale: float | None = None,  # default 1/sqrt(D)
    launch: HostDecodeLaunch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(output [B, Hq, D], natural-log lse [B, Hq] fp32) of decode attention over host pages,
    on the current stream. Block ids and lengths are not range-checked (that would sync): the
    caller's tables must hold valid pages for every position < context_lens[b]."""
    _check_inputs(q, k_pages, v_pages, block_tables, context_lens, need_pinned=True)
    out, lse = _outputs(q, out, lse)
    batch, num_heads, head_dim = q.shape
    if batch == 0:
        return out, lse
    launch = launch or default_launch(k_pages.dtype)
    splits = num_splits or choose_num_splits(q, k_pages, block_tables.shape[1], launch)
    check(1 <= splits <= MAX_SPLITS, lambda: f"num_splits must be in [1, {MAX_SPLITS}]")
    single = splits == 1
    if not single:
        workspace = workspace or HostDecodeWorkspace.allocate(batch, num_heads, head_dim,
                                                              splits, q.device)
        check(workspace.fits(batch, num_heads, head_dim, splits),
              lambda: f"workspace must be contiguous [{batch}, {num_heads}, {splits}, {head_dim}]")
        part, part_lse = workspace.part, workspace.part_lse
    else:
        part, part_lse = out, lse  # placeholders: the kernel writes out and lse itself
    num_kv_heads, page_size = k_pages.shape[1], k_pages.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    _host_decode_kernel[(num_kv_heads, batch, splits)](
        q, q.stride(0), q.stride(1),
        k_pages, k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages, v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        block_tables, block_tables.stride(0), context_lens,
        out, out.stride(0), out.stride(1), lse, lse.stride(0),
        part, part_lse, scale * LOG2E, splits,
        G=num_heads // num_kv_heads, G_PAD=max(16, next_pow2(num_heads // num_kv_heads)),
        HEAD_DIM=head_dim, D_PAD=max(16, next_pow2(head_dim)), PAGE_SIZE=page_size,
        BLOCK_N=launch.block_n, SINGLE_SPLIT=single, UPCAST=upcast(k_pages.dtype),
        PRECISION=dot_precision(k_pages.dtype), num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    if not single:
        _merge_splits_kernel[(batch, num_heads)](
            part, part_lse, out, out.stride(0), out.stride(1), lse, lse.stride(0), splits,
            S_PAD=next_pow2(splits), HEAD_DIM=head_dim, D_PAD=next_pow2(head_dim),
            num_warps=4,
        )
    return out, lse


def host_decode_attention_ref(
    q: torch.Tensor,  # [B, Hq, D]
    k_pages: torch.Tensor,  # [num_pages, Hkv, page_size, D] (host)
    v_pages: torch.Tensor,
    block_tables: torch.Tensor,  # [B, max_pages] int32
    context_lens: torch.Tensor,  # [B] int32
    *,
    out: torch.Tensor | None = None,
    lse: torch.Tensor | None = None,
    num_splits: int | None = None,  # accepted for the same signature; one pass here
    workspace: HostDecodeWorkspace | None = None,
    scale: float | None = None,
    launch: HostDecodeLaunch | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure torch, fp32 math on the host (the CPU path and the oracle); results land on q's
    device, in `out` / `lse` where given. Block ids and lengths are range-checked here."""
    del num_splits, workspace, launch
    _check_inputs(q, k_pages, v_pages, block_tables, context_lens, need_pinned=False)
    out, lse = _outputs(q, out, lse)
    batch, num_heads, head_dim = q.shape
    num_pages, num_kv_heads, page_size, _ = k_pages.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    tables, qh = block_tables.cpu(), q.detach().float().cpu()
    res = torch.zeros(batch, num_heads, head_dim)
    res_lse = torch.full((batch, num_heads), -math.inf)
    for b, length in enumerate(context_lens.tolist()):
        if not 0 <= length <= tables.shape[1] * page_size:
            raise ValueError(f"context_lens[{b}] = {length} outside "
                             f"[0, {tables.shape[1] * page_size}]")
        if length == 0:
            continue
        ids = tables[b, : -(-length // page_size)].long()
        if not bool(((ids >= 0) & (ids < num_pages)).all()):
            raise ValueError(f"block_tables[{b}] has ids outside [0, {num_pages}): {ids.tolist()}")
        group = num_heads // num_kv_heads
        k = _gather(k_pages, ids, length).repeat_interleave(group, 0)  # [Hq, length, D]
        v = _gather(v_pages, ids, length).repeat_interleave(group, 0)
        scores = torch.einsum("hd,htd->ht", qh[b], k) * scale
        res_lse[b] = torch.logsumexp(scores, dim=-1)
        res[b] = torch.einsum("ht,htd->hd", torch.softmax(scores, dim=-1), v)
    out.copy_(res)
    lse.copy_(res_lse)
    return out, lse


def _gather(pages: torch.Tensor, ids: torch.Tensor, length: int) -> torch.Tensor:
    """[Hkv, length, D] fp32: a request's first `length` rows, page by page."""
    tiles = pages[ids].float()  # [n, Hkv, page_size, D]
    return tiles.permute(1, 0, 2, 3).reshape(pages.shape[1], -1, pages.shape[3])[:, :length]
