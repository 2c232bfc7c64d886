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
of the group (padded to 16 rows for `tl.dot`). With one split the program writes the output
and natural LSE itself. With more, every split writes a partial output and its log2-sum-exp to
a workspace, then counts itself in at its (request, KV head) counter; the split that arrives
last merges the group's splits and writes the output and LSE.

Why the merge is fused ("last program merges"): a second launch costs a few microseconds each
call, for every layer, and on the H200 each separately launched op pays extra while the link
carries data towards the GPU, as this kernel's own reads make it do. The ordering: a split's
threads all store (a barrier), then one acq_rel atomic add publishes them (release); the
program that reads count S-1 has acquired every other split's stores, reads the partials
past L1, and resets the counter to 0, so the next call or graph replay needs no memset.

Why splits: the host read is latency-bound per program (a PCIe read takes far longer than an
HBM one), so the launch needs enough programs resident to keep many reads outstanding;
`default_num_splits` cuts each request until the grid fills the SMs' resident slots.

How the host pointer gets to the kernel (as in kvtier/kernels/host_page_io.py): the pinned CPU
tensor is passed as is; Triton's launcher asks the driver for the device address of every
pointer argument, which for page-locked memory under UVA is valid. A CUDA graph captures that
address: the pages must stay at their addresses between replays (a preallocated pool does).
Capturable: no host sync (the split count comes from the block table's width, a host bound on
every context), and nothing is allocated when `out`, `lse` and `workspace` are given
(`HostDecodeWorkspaces` hands out views of buffers kept for the caller's lifetime).
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
    """Split partials: outputs [B, Hq, S, D] fp32 and their log2-sum-exp [B, Hq, S] fp32; and
    per (request, KV head) the splits done so far, arrivals [B, >= Hkv] int32. The counters are
    zero between calls: allocate() zeroes them and each launch's last split resets its own, so
    a call (or a graph replay) needs no memset first. Calls sharing one workspace must be
    ordered on one stream (a concurrent one would mix their counts and partials)."""

    part: torch.Tensor
    part_lse: torch.Tensor
    arrivals: torch.Tensor

    @staticmethod
    def allocate(batch: int, num_heads: int, head_dim: int, num_splits: int,
                 device: torch.device, num_kv_heads: int | None = None) -> HostDecodeWorkspace:
        # Without num_kv_heads a counter per query head: enough for any grouping.
        counters = num_heads if num_kv_heads is None else num_kv_heads
        return HostDecodeWorkspace(
            torch.empty(batch, num_heads, num_splits, head_dim, dtype=torch.float32,
                        device=device),
            torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=device),
            torch.zeros(batch, counters, dtype=torch.int32, device=device))

    def fits(self, batch: int, num_heads: int, head_dim: int, num_splits: int,
             num_kv_heads: int | None = None) -> bool:
        counters = num_heads if num_kv_heads is None else num_kv_heads
        a = self.arrivals
        return (tuple(self.part.shape) == (batch, num_heads, num_splits, head_dim)
                and tuple(self.part_lse.shape) == (batch, num_heads, num_splits)
                and self.part.is_contiguous() and self.part_lse.is_contiguous()
                and a.dtype == torch.int32 and a.dim() == 2 and a.shape[0] == batch
                and a.shape[1] >= counters and a.stride(1) == 1)


class HostDecodeWorkspaces:
    """Workspaces for calls of any shape, views of flat buffers that only grow: a caller that
    launches every layer takes them here rather than allocating each call (a fresh workspace's
    counters cost a memset launch). Outgrown buffers are kept, not freed: a CUDA graph captured
    with a view replays at its address; each new set at least doubles the last, so all held
    take under twice the newest. The calls must be ordered on one stream."""

    def __init__(self) -> None:
        self._held: list[HostDecodeWorkspace] = []  # flat buffers, the newest last
        self._views: dict[tuple[int, ...], HostDecodeWorkspace] = {}  # of the newest, by shape

    def take(self, q: torch.Tensor, k_pages: torch.Tensor, block_tables: torch.Tensor,
             launch: HostDecodeLaunch | None = None) -> tuple[int, HostDecodeWorkspace | None]:
        """(num_splits, workspace) for `host_decode_attention` over these arguments; no
        workspace where one split writes the output itself."""
        splits = choose_num_splits(q, k_pages, block_tables.shape[1], launch)
        if splits == 1 or q.shape[0] == 0:
            return splits, None
        (batch, num_heads, head_dim), num_kv_heads = q.shape, k_pages.shape[1]
        key = (batch, num_heads, num_kv_heads, head_dim, splits)
        ws = self._views.get(key)
        if ws is None or ws.part.device != q.device:
            ws = self._views[key] = self._view(key, q.device)
        return splits, ws

    def _view(self, key: tuple[int, ...], device: torch.device) -> HostDecodeWorkspace:
        batch, num_heads, num_kv_heads, head_dim, splits = key
        rows = batch * num_heads * splits
        need = (rows * head_dim, rows, batch * num_kv_heads)
        flat = self._held[-1] if self._held else None
        have = ((flat.part.numel(), flat.part_lse.numel(), flat.arrivals.numel())
                if flat is not None and flat.part.device == device else (0, 0, 0))
        if flat is None or any(n > h for n, h in zip(need, have)):
            size = [max(n, 2 * h) for n, h in zip(need, have)]
            flat = HostDecodeWorkspace(torch.empty(size[0], dtype=torch.float32, device=device),
                                       torch.empty(size[1], dtype=torch.float32, device=device),
                                       torch.zeros(size[2], dtype=torch.int32, device=device))
            self._held.append(flat)
            self._views.clear()  # views of the outgrown buffers: later calls take the new
        return HostDecodeWorkspace(
            flat.part[: need[0]].view(batch, num_heads, splits, head_dim),
            flat.part_lse[: need[1]].view(batch, num_heads, splits),
            flat.arrivals[: need[2]].view(batch, num_kv_heads))


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


@triton.jit
def _store_output(out_rows, lse_rows, o, lse2, d, g_ok, d_ok):
    """A group's output [G_PAD, D_PAD] at out_rows ([G_PAD, 1] row pointers) and its
    natural-log LSE at lse_rows ([G_PAD]); lse2 is the log2-sum-exp."""
    tl.store(out_rows + d[None, :], o.to(out_rows.dtype.element_ty),
             mask=g_ok[:, None] & d_ok[None, :])
    tl.store(lse_rows, lse2 * 0.6931471805599453, mask=g_ok)


@triton.jit
def _arrive(part_ptr, part_lse_ptr, count_ptr, rows, split, num_splits, o, lse2, d, g_ok, d_ok,
            HEAD_DIM: tl.constexpr):
    """Store this split's partial output and log2-sum-exp, then count the split in at its
    (request, KV head) counter. True for the split that arrives last: its acq_rel add has
    acquired every other split's stores, which their own adds released."""
    tl.store(part_ptr + (rows + split)[:, None] * HEAD_DIM + d[None, :], o,
             mask=g_ok[:, None] & d_ok[None, :])
    tl.store(part_lse_ptr + rows + split, lse2, mask=g_ok)
    # Every thread's stores before the one thread's release below.
    tl.debug_barrier()
    return tl.atomic_add(count_ptr, 1, sem="acq_rel") == num_splits - 1


@triton.jit
def _merge_head(part_ptr, part_lse_ptr, row0, num_splits, d, d_ok, S_PAD: tl.constexpr,
                HEAD_DIM: tl.constexpr):
    """(output [D_PAD], log2-sum-exp) of one query head's splits, rows row0 .. row0 + S - 1,
    all read in one load each (the merge sits at the end of the step's critical path: a loop
    over splits would pay a memory latency per split). Each split weighs exp2(lse2 - max
    lse2); an empty split (lse2 -inf) is never read (its slot may hold anything), an empty
    context gives 0, -inf. The loads skip L1 (.cg): other SMs' programs wrote these rows."""
    s = tl.arange(0, S_PAD)
    lse2 = tl.load(part_lse_ptr + row0 + s, mask=s < num_splits, other=float("-inf"),
                   cache_modifier=".cg")
    has = lse2 > float("-inf")
    top = tl.max(lse2, 0)
    top = tl.where(top == float("-inf"), 0.0, top)  # an empty context: all weights 0
    w = tl.where(has, tl.exp2(lse2 - top), 0.0)
    o = tl.load(part_ptr + (row0 + s)[:, None] * HEAD_DIM + d[None, :],
                mask=has[:, None] & d_ok[None, :], other=0.0, cache_modifier=".cg")
    total = tl.sum(w, 0)
    res = tl.sum(w[:, None] * o, 0) / tl.where(total > 0, total, 1.0)
    return res, tl.where(total > 0, top + tl.log2(tl.where(total > 0, total, 1.0)),
                         float("-inf"))


@triton.jit
def _merge_group(part_ptr, part_lse_ptr, out_row, stride_oh, lse_row, row_base, first_head,
                 num_splits, d, d_ok, G: tl.constexpr, S_PAD: tl.constexpr,
                 HEAD_DIM: tl.constexpr):
    """Merge and write the outputs and natural LSEs of query heads first_head .. + G - 1 of
    one request: its partials' rows start at row_base (request b's first head), out_row /
    lse_row are its rows of out and lse."""
    for i in tl.static_range(G):
        head = first_head + i
        merged, merged_lse2 = _merge_head(part_ptr, part_lse_ptr, (row_base + head) * num_splits,
                                          num_splits, d, d_ok, S_PAD, HEAD_DIM)
        tl.store(out_row + head * stride_oh + d, merged.to(out_row.dtype.element_ty),
                 mask=d_ok)
        tl.store(lse_row + head, merged_lse2 * 0.6931471805599453)


@triton.jit(do_not_specialize=["stride_bt", "num_splits"])
def _host_decode_kernel(
    q_ptr, stride_qb, stride_qh,  # [B, Hq, D] (GPU)
    k_ptr, stride_kp, stride_kh, stride_kr,  # [num_pages, Hkv, page_size, D] (pinned host)
    v_ptr, stride_vp, stride_vh, stride_vr,
    bt_ptr, stride_bt, lens_ptr,  # [B, max_pages] int32, [B] int32
    out_ptr, stride_ob, stride_oh, lse_ptr, stride_lb,  # [B, Hq, D], [B, Hq] natural log
    part_ptr, part_lse_ptr,  # [B, Hq, S, D] fp32, [B, Hq, S] fp32 (log2 domain)
    arrivals_ptr, stride_ab,  # [B, >= Hkv] int32, zero between launches
    qk_scale, num_splits,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr, SINGLE_SPLIT: tl.constexpr,
    S_PAD: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
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
    out_rows = out_ptr + b * stride_ob + heads[:, None] * stride_oh
    lse_rows = lse_ptr + b * stride_lb + heads
    if SINGLE_SPLIT:
        _store_output(out_rows, lse_rows, o, lse2, d, g_ok, d_ok)
    else:
        rows = (b * (G * tl.num_programs(0)) + heads) * num_splits  # [G_PAD] each head's split 0
        count_ptr = arrivals_ptr + b * stride_ab + kv_head
        if _arrive(part_ptr, part_lse_ptr, count_ptr, rows, split, num_splits, o, lse2, d, g_ok,
                   d_ok, HEAD_DIM):
            tl.store(count_ptr, 0)  # every split has arrived: zero for the next launch
            _merge_group(part_ptr, part_lse_ptr, out_ptr + b * stride_ob, stride_oh,
                         lse_ptr + b * stride_lb, b * (G * tl.num_programs(0)), kv_head * G,
                         num_splits, d, d_ok, G, S_PAD, HEAD_DIM)


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
    workspace: HostDecodeWorkspace | None = None,  # partials, counters (allocated if None)
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
    num_kv_heads, page_size = k_pages.shape[1], k_pages.shape[2]
    single = splits == 1
    if not single:
        workspace = workspace or HostDecodeWorkspace.allocate(batch, num_heads, head_dim,
                                                              splits, q.device, num_kv_heads)
        check(workspace.fits(batch, num_heads, head_dim, splits, num_kv_heads),
              lambda: f"workspace must be contiguous [{batch}, {num_heads}, {splits}, {head_dim}]"
                      f" partials with [{batch}, >= {num_kv_heads}] int32 counters")
        part, part_lse, arrivals = workspace.part, workspace.part_lse, workspace.arrivals
    else:  # placeholders: the kernel writes out and lse itself
        part, part_lse, arrivals = out, lse, context_lens.view(batch, 1)
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    _host_decode_kernel[(num_kv_heads, batch, splits)](
        q, q.stride(0), q.stride(1),
        k_pages, k_pages.stride(0), k_pages.stride(1), k_pages.stride(2),
        v_pages, v_pages.stride(0), v_pages.stride(1), v_pages.stride(2),
        block_tables, block_tables.stride(0), context_lens,
        out, out.stride(0), out.stride(1), lse, lse.stride(0),
        part, part_lse, arrivals, arrivals.stride(0), scale * LOG2E, splits,
        G=num_heads // num_kv_heads, G_PAD=max(16, next_pow2(num_heads // num_kv_heads)),
        HEAD_DIM=head_dim, D_PAD=max(16, next_pow2(head_dim)), PAGE_SIZE=page_size,
        BLOCK_N=launch.block_n, SINGLE_SPLIT=single, S_PAD=next_pow2(splits),
        UPCAST=upcast(k_pages.dtype),
        PRECISION=dot_precision(k_pages.dtype), num_warps=launch.num_warps,
        num_stages=launch.num_stages,
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
