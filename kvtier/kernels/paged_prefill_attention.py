"""Varlen causal attention over paged KV for chunked prefill with a cached prefix; mixed
query lengths in one launch, decode rows (q_len = 1) included, so it doubles as the unified
fallback.

The new tokens' K/V are already in the cache (kv_write runs first), so every key comes from
one source, the paged pool. Request b's query token i sits at absolute position
`ctx_b + i` with `ctx_b = seq_len_b - q_len_b`, and sees keys `0 .. ctx_b + i`.

Work split: one program per (query tile, KV head). A tile is BLOCK_Q tokens x G_PAD heads
of one GQA group, flattened to BLOCK_M = BLOCK_Q * G_PAD rows, so each K/V tile loaded is
used by all heads that share it. Query tiles are numbered without a host sync: request b's
tiles start at `(query_start_loc[b] - q_base) // BLOCK_Q + b`, an upper bound on the
tiles before it (each request wastes at most one program), and a program finds its request
by binary search over query_start_loc. The grid depends only on (num_tokens, num_reqs).

The KV loop runs in two phases: keys every row of the tile may see (no causal mask, the
common case for long prefixes), then the diagonal tiles with the mask.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.attention_sources import load_paged_kv_tile, online_softmax_update
from kvtier.kernels.launch import (
    check,
    check_last_dim_contiguous,
    dot_precision,
    next_pow2,
    upcast,
)

LOG2E = 1.4426950408889634


@triton.jit
def _find_request(query_start_loc_ptr, tile, num_reqs, q_base, BLOCK_Q: tl.constexpr):
    """The last request b whose first tile index (qsl[b] - q_base) // BLOCK_Q + b <= tile."""
    lo: tl.int32 = 0
    hi: tl.int32 = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first = (tl.load(query_start_loc_ptr + mid) - q_base) // BLOCK_Q + mid
        if first <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def causal_tile_output(
    q, q_pos, first_q_pos, seq_len, kv_head,  # q [BLOCK_M, D_PAD], q_pos [BLOCK_M]
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head, bt_row, d, d_ok,
    qk_scale,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    D_PAD: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """A query tile's attention output over its request's paged keys, causally masked."""
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
    n = tl.arange(0, BLOCK_N)
    # Phase 1: whole tiles of keys before the tile's first query position: no mask needed.
    unmasked_end = (first_q_pos // BLOCK_N) * BLOCK_N
    all_rows = tl.full([1, BLOCK_N], 1, tl.int1)
    for start in range(0, unmasked_end, BLOCK_N):
        pos = start + n
        k, v = load_paged_kv_tile(kv_ptr, bt_row, pos, pos < unmasked_end, d, d_ok, kv_head,
                                  stride_kv_block, stride_kv_kv, stride_kv_tok,
                                  stride_kv_head, BLOCK_SIZE, UPCAST)
        m, l_i, acc = online_softmax_update(q, k, v, m, l_i, acc, all_rows, qk_scale,
                                            PRECISION)
    # Phase 2: the diagonal, up to the tile's last query position.
    kv_end = tl.minimum(seq_len, first_q_pos + BLOCK_Q)
    for start in range(unmasked_end, kv_end, BLOCK_N):
        pos = start + n
        valid = pos < kv_end
        k, v = load_paged_kv_tile(kv_ptr, bt_row, pos, valid, d, d_ok, kv_head,
                                  stride_kv_block, stride_kv_kv, stride_kv_tok,
                                  stride_kv_head, BLOCK_SIZE, UPCAST)
        causal = valid[None, :] & (pos[None, :] <= q_pos[:, None])
        m, l_i, acc = online_softmax_update(q, k, v, m, l_i, acc, causal, qk_scale,
                                            PRECISION)
    return acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def prefill_tile(
    tile, kv_head,  # which query tile (see the module docstring) and which KV head
    q_ptr, stride_qt, stride_qh,  # [T, Hq, D]
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
    block_tables_ptr, stride_bt,  # [R, max_blocks]
    seq_lens_ptr, query_start_loc_ptr,  # [R], [R + 1] (absolute token offsets)
    out_ptr, stride_ot, stride_oh,  # [T, Hq, D]
    qk_scale, num_reqs, q_base,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    """One (query tile, KV head) of the varlen prefill: the body of `_prefill_kernel`, shared
    with the horizontally fused kernel (benchmarks/experiments/kernels/fused_attention.py).
    A tile past its request's last query token (the at most one spare tile per request) does
    nothing; that is an `if`, not an early return, so the function can sit inside a
    persistent loop."""
    b = _find_request(query_start_loc_ptr, tile, num_reqs, q_base, BLOCK_Q)
    q_start = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_start
    local = tile - ((q_start - q_base) // BLOCK_Q + b)
    if local * BLOCK_Q < q_len:
        seq_len = tl.load(seq_lens_ptr + b)
        ctx = seq_len - q_len

        r = tl.arange(0, BLOCK_M)  # BLOCK_M = BLOCK_Q * G_PAD
        t = local * BLOCK_Q + r // G_PAD  # query token within the request
        g = r % G_PAD
        row_ok = (t < q_len) & (g < G)
        d = tl.arange(0, D_PAD)
        d_ok = d < HEAD_DIM
        q_off = (q_start + t).to(tl.int64) * stride_qt + (kv_head * G + g) * stride_qh
        q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :],
                    other=0.0)  # [BLOCK_M, D_PAD]
        if UPCAST:
            q = q.to(tl.float32)
        q_pos = ctx + t  # [BLOCK_M] absolute positions (padding rows past q_len see everything)

        bt_row = block_tables_ptr + b.to(tl.int64) * stride_bt
        o = causal_tile_output(q, q_pos, ctx + local * BLOCK_Q, seq_len, kv_head,
                               kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok,
                               stride_kv_head, bt_row, d, d_ok, qk_scale,
                               BLOCK_SIZE, BLOCK_Q, BLOCK_M, D_PAD, BLOCK_N, UPCAST, PRECISION)
        o_off = (q_start + t).to(tl.int64) * stride_ot + (kv_head * G + g) * stride_oh
        tl.store(out_ptr + o_off[:, None] + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & d_ok[None, :])


# Per-step values (request count, row offset, table width) are not specialized on: one compile
# serves every batch instead of one per divisibility class seen.
@triton.jit(do_not_specialize=["stride_bt", "num_reqs", "q_base"])
def _prefill_kernel(
    q_ptr, stride_qt, stride_qh,  # [T, Hq, D]
    kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
    block_tables_ptr, stride_bt,  # [R, max_blocks]
    seq_lens_ptr, query_start_loc_ptr,  # [R], [R + 1] (absolute token offsets)
    out_ptr, stride_ot, stride_oh,  # [T, Hq, D]
    qk_scale, num_reqs, q_base,
    G: tl.constexpr, G_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    # Reversed, so the heaviest tiles (late in a long prompt, they see the most keys) start
    # first and the light ones fill the tail of the launch.
    prefill_tile(
        tl.num_programs(0) - 1 - tl.program_id(0), tl.program_id(1),
        q_ptr, stride_qt, stride_qh,
        kv_ptr, stride_kv_block, stride_kv_kv, stride_kv_tok, stride_kv_head,
        block_tables_ptr, stride_bt, seq_lens_ptr, query_start_loc_ptr,
        out_ptr, stride_ot, stride_oh, qk_scale, num_reqs, q_base,
        G, G_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, BLOCK_Q, BLOCK_M, BLOCK_N, UPCAST, PRECISION,
    )


def _default_tiles(G: int, dtype: torch.dtype, interpret: bool) -> tuple[int, int]:
    """(BLOCK_M rows, BLOCK_N keys), 4 warps. 64 x 64 is the tile that is level with torch's
    flash SDPA on both GQA and MHA models; taller tiles lose on MHA, which puts BLOCK_M
    tokens of one head in a tile (results/kernels/kernels_h200.json, sweep). fp32 tiles are
    twice the bytes, so they shrink to stay inside shared memory."""
    if interpret:
        return 16 * max(1, next_pow2(G) // 4), 32  # few programs, few tiles: fast on CPU
    if dtype == torch.float32:
        return 64, 32
    return 64, 64


def check_prefill_args(
    q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, out: torch.Tensor | None,
) -> torch.Tensor:
    """Shape, dtype and stride checks of a prefill problem; returns `out`, allocated if None."""
    T, Hq, D = q.shape
    _, two, block_size, Hkv, Dk = kv_cache.shape
    R = seq_lens.shape[0]
    check(two == 2 and Dk == D, lambda: f"kv_cache {tuple(kv_cache.shape)} does not match q {q.shape}")
    check(Hq % Hkv == 0, lambda: f"Hq={Hq} is not a multiple of Hkv={Hkv}")
    check(query_start_loc.shape[0] == R + 1 and query_start_loc.is_contiguous(),
          "query_start_loc: contiguous [R + 1]")
    check(block_tables.dim() == 2 and block_tables.shape[0] == R and block_tables.stride(1) == 1,
          "block_tables: [R, max_blocks], rows contiguous")
    for name, t in (("block_tables", block_tables), ("seq_lens", seq_lens),
                    ("query_start_loc", query_start_loc)):
        check(t.dtype == torch.int32, name + " must be int32")
    check(seq_lens.is_contiguous(), "seq_lens must be contiguous")
    check(kv_cache.dtype == q.dtype, lambda: f"dtype mismatch: q {q.dtype}, kv {kv_cache.dtype}")
    check_last_dim_contiguous("q", q)
    check_last_dim_contiguous("kv_cache", kv_cache)
    if out is None:
        out = torch.empty_like(q)
    check(out.shape == q.shape and out.stride(-1) == 1, "out: [T, Hq, D], last dim contiguous")
    return out


def prefill_tile_shape(G: int, q: torch.Tensor, block_m: int | None,
                       block_n: int | None) -> tuple[int, int]:
    """(BLOCK_Q query tokens per tile, BLOCK_N keys per tile); a tile has BLOCK_Q * G_PAD rows."""
    default_m, default_n = _default_tiles(G, q.dtype, q.device.type == "cpu")
    block_m, block_n = block_m or default_m, block_n or default_n
    block_q = max(1, block_m // next_pow2(G))
    check(block_q * next_pow2(G) >= 16, "BLOCK_M must cover at least 16 rows for tl.dot")
    return block_q, block_n


def num_tiles(num_tokens: int, num_reqs: int, block_q: int) -> int:
    """Query tiles of a batch, without a sync: an upper bound, at most one spare per request."""
    return num_tokens // block_q + num_reqs


def paged_prefill_attention(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    block_tables: torch.Tensor,  # [R, max_blocks] int32
    seq_lens: torch.Tensor,  # [R] int32, context length after this step
    query_start_loc: torch.Tensor,  # [R + 1] int32, absolute offsets into q's rows
    scale: float,
    *,
    num_tokens: int | None = None,  # host count of rows from query_start_loc[0] (no sync)
    q_base: int = 0,  # host copy of query_start_loc[0]
    out: torch.Tensor | None = None,  # [T, Hq, D]; only the rows of these requests are written
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> torch.Tensor:
    T, Hq, D = q.shape
    block_size, Hkv, R = kv_cache.shape[2], kv_cache.shape[3], seq_lens.shape[0]
    out = check_prefill_args(q, kv_cache, block_tables, seq_lens, query_start_loc, out)
    if num_tokens is None:
        num_tokens = T - q_base
    if R == 0 or num_tokens == 0:
        return out
    G, G_PAD = Hq // Hkv, next_pow2(Hq // Hkv)
    block_q, block_n = prefill_tile_shape(G, q, block_m, block_n)
    grid = (num_tiles(num_tokens, R, block_q), Hkv)
    _prefill_kernel[grid](
        q, q.stride(0), q.stride(1),
        kv_cache, kv_cache.stride(0), kv_cache.stride(1), kv_cache.stride(2), kv_cache.stride(3),
        block_tables, block_tables.stride(0),
        seq_lens, query_start_loc,
        out, out.stride(0), out.stride(1),
        scale * LOG2E, R, q_base,
        G=G, G_PAD=G_PAD, HEAD_DIM=D, D_PAD=next_pow2(D),
        BLOCK_SIZE=block_size, BLOCK_Q=block_q, BLOCK_M=block_q * G_PAD, BLOCK_N=block_n,
        UPCAST=upcast(q.dtype), PRECISION=dot_precision(q.dtype),
        num_warps=num_warps or (8 if block_q * G_PAD >= 128 else 4), num_stages=num_stages,
    )
    return out


def paged_prefill_attention_ref(
    q: torch.Tensor,  # [T, Hq, D]
    kv_cache: torch.Tensor,  # [num_blocks, 2, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [R, max_blocks]
    seq_lens: torch.Tensor,  # [R]
    query_start_loc: torch.Tensor,  # [R + 1]
    scale: float,
) -> torch.Tensor:
    """Pure torch, fp32 math: the CPU path and the oracle. Rows of other requests are 0."""
    Hq, Hkv, bs = q.shape[1], kv_cache.shape[3], kv_cache.shape[2]
    out = torch.zeros_like(q)
    for b in range(seq_lens.shape[0]):
        q0, q1, seq_len = int(query_start_loc[b]), int(query_start_loc[b + 1]), int(seq_lens[b])
        pos = torch.arange(seq_len, device=q.device)
        blocks = block_tables[b, pos // bs].long()
        k = kv_cache[blocks, 0, pos % bs].float().repeat_interleave(Hq // Hkv, dim=1)
        v = kv_cache[blocks, 1, pos % bs].float().repeat_interleave(Hq // Hkv, dim=1)
        s = torch.einsum("thd,nhd->htn", q[q0:q1].float(), k) * scale
        q_pos = seq_len - (q1 - q0) + torch.arange(q1 - q0, device=q.device)
        s = s.masked_fill(pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        out[q0:q1] = torch.einsum("htn,nhd->thd", s.softmax(-1), v).to(q.dtype)
    return out
