"""Horizontally fused attention: a varlen causal prefill and a split-K decode in one launch.

eLLM (item 4, "horizontal fusion") runs layer i+1's prefix-recompute attention beside layer
i's decode attention; a mixed step runs its prefill rows beside its decode rows of the same
layer. The two problems are independent (own q, KV view, block tables, lengths, output), one
compute-bound and one memory-bound, so they share the GPU better side by side than one after
the other, and one launch instead of two saves ~45-95 us of host time per layer.

Work items: prefill item w -> (query tile num_tiles - 1 - w // Hkv, KV head w % Hkv), the
heaviest tiles first as in `_prefill_kernel`; decode item w -> (request, KV head, split),
split fastest. Two schedules map programs to items:

    interleaved (default)  one program per item, N = P + D programs; program p is a prefill
                           item iff floor((p+1) P / N) > floor(p P / N). The hardware issues
                           programs in order, so both parts progress at the same pace and
                           every SM holds a mix of compute-bound and memory-bound programs.
    persistent             PROGRAMS_PER_SM x SMs programs, [0, P_prefill) loop over prefill
                           items, the rest over decode items (the paper's SM split).
                           `split_programs` divides them by the two parts' estimated times
                           (FLOPs at the prefill kernel's rate, bytes at the decode kernel's),
                           rounded to whole programs. Measured slower than the interleaved
                           schedule on the H200 (bench_hfusion.py): a static split
                           misjudges small prefills, and fewer resident decode programs cannot
                           keep HBM busy.

The bodies are the same @triton.jit functions the standalone kernels call (`prefill_tile`,
`decode_split`), so the fused kernel is exact wherever they are. Decode splits > 1 (only
when the batch is too small to fill the GPU) are merged by the decode kernel's reduce, a
second small launch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check, dot_precision, next_pow2, num_sms, upcast
from kvtier.kernels.paged_decode_attention import (
    LOG2E,
    DenseSegment,
    check_decode_args,
    decode_split,
    paged_decode_attention_ref,
    reduce_splits,
    split_partials,
)
from kvtier.kernels.paged_decode_launch import (
    MIN_TOKENS_PER_SPLIT,
    _default_block_n,
    default_num_splits,
    programs_per_sm,
)
from kvtier.kernels.paged_prefill_attention import (
    check_prefill_args,
    num_tiles,
    paged_prefill_attention_ref,
    prefill_tile,
    prefill_tile_shape,
)

# Rates of the standalone kernels on the H200 (results/kernels/kernels_h200*.json): the
# prefill kernel reaches ~330 TFLOP/s at 8k tokens, the decode kernel ~90 % of 4.24 TB/s.
# Only their ratio matters: it turns FLOPs and bytes into comparable times.
PREFILL_FLOPS_PER_S = 330e12
DECODE_BYTES_PER_S = 3.8e12
PROGRAMS_PER_SM = 2  # resident programs per SM with 64-key bf16 tiles (shared memory bound)


@dataclass
class PrefillProblem:
    """A varlen causal prefill over paged KV: the arguments of `paged_prefill_attention`."""

    q: torch.Tensor  # [T, Hq, D]
    kv_cache: torch.Tensor  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    block_tables: torch.Tensor  # [R, max_blocks] int32
    seq_lens: torch.Tensor  # [R] int32, context length after this step
    query_start_loc: torch.Tensor  # [R + 1] int32, absolute offsets into q's rows
    out: torch.Tensor | None = None  # [T, Hq, D]; only these requests' rows are written
    num_tokens: int | None = None  # host count of rows from query_start_loc[0]
    q_base: int = 0  # host copy of query_start_loc[0]
    flops: float | None = None  # host estimate (`prefill_flops`); None reads the lengths (sync)


@dataclass
class DecodeProblem:
    """A split-K paged decode: the arguments of `paged_decode_attention`."""

    q: torch.Tensor  # [B, Hq, D]
    kv_cache: torch.Tensor  # [num_blocks, 2, block_size, Hkv, D] (one layer's view)
    block_tables: torch.Tensor  # [B, max_blocks] int32
    seq_lens: torch.Tensor  # [B] int32, whole context incl. the new token and any prefix
    out: torch.Tensor | None = None  # [B, Hq, D]
    prefix: DenseSegment | None = None
    max_seq_len: int | None = None  # host bound on seq_lens; None reads them (sync)
    num_splits: int | None = None  # None: the fewest that feed the decode programs
    bytes: float | None = None  # host estimate (`decode_bytes`); None reads the lengths (sync)


def prefill_flops(query_lens: list[int], seq_lens: list[int], num_heads: int,
                  head_dim: int) -> float:
    """QK^T and PV FLOPs of a causal prefill: token i of a chunk sees ctx + i + 1 keys."""
    return sum(4.0 * num_heads * head_dim * n * (s - n + (n + 1) / 2)
               for n, s in zip(query_lens, seq_lens))


def decode_bytes(seq_lens: list[int], num_kv_heads: int, head_dim: int, elem_bytes: int) -> float:
    """K and V bytes a decode step reads (the q/out traffic is negligible)."""
    return 2.0 * sum(seq_lens) * num_kv_heads * head_dim * elem_bytes


def split_programs(prefill_time: float, decode_time: float, num_programs: int,
                   prefill_work: int, decode_work: int) -> tuple[int, int]:
    """(prefill programs, decode programs): `num_programs` divided in proportion to the two
    parts' estimated times, rounded, each part >= 1 when it has work and never more programs
    than work items."""
    if prefill_work == 0 or decode_work == 0:
        return min(num_programs, prefill_work), min(num_programs, decode_work)
    total = prefill_time + decode_time
    share = prefill_time / total if total > 0 else 0.5
    p = min(max(1, round(share * num_programs)), num_programs - 1, prefill_work)
    return p, min(num_programs - p, decode_work)


# Per-step values (lengths, counts, program split, table widths) are runtime arguments and
# never specialized on: one compile serves every step.
@triton.jit(do_not_specialize=[
    "p_stride_bt", "p_num_reqs", "p_q_base", "p_tiles", "p_work", "p_programs",
    "d_stride_bt", "d_num_kv_heads", "d_num_splits", "d_work", "d_programs",
])
def _fused_attention_kernel(
    # prefill part
    p_q_ptr, p_stride_qt, p_stride_qh,
    p_kv_ptr, p_stride_kv_block, p_stride_kv_kv, p_stride_kv_tok, p_stride_kv_head,
    p_bt_ptr, p_stride_bt, p_seq_lens_ptr, p_qsl_ptr,
    p_out_ptr, p_stride_ot, p_stride_oh,
    p_num_reqs, p_q_base, p_num_kv_heads, p_tiles, p_work, p_programs,
    # decode part
    d_q_ptr, d_stride_qb, d_stride_qh,
    d_kv_ptr, d_stride_kv_block, d_stride_kv_kv, d_stride_kv_tok, d_stride_kv_head,
    d_bt_ptr, d_stride_bt, d_seq_lens_ptr,
    d_pk_ptr, d_pv_ptr, d_stride_p_tok, d_stride_p_head, d_prefix_loc_ptr,
    d_out_ptr, d_stride_ob, d_stride_oh, d_part_ptr, d_lse_ptr,
    d_num_kv_heads, d_num_splits, d_min_split_tokens, d_work, d_programs,
    qk_scale,
    HEAD_DIM: tl.constexpr, D_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
    P_G: tl.constexpr, P_G_PAD: tl.constexpr, P_BLOCK_Q: tl.constexpr,
    P_BLOCK_M: tl.constexpr, P_BLOCK_N: tl.constexpr,
    D_G: tl.constexpr, D_G_PAD: tl.constexpr, D_BLOCK_N: tl.constexpr,
    D_SINGLE_SPLIT: tl.constexpr, D_HAS_PREFIX: tl.constexpr, PERSISTENT: tl.constexpr,
):
    pid = tl.program_id(0)
    if PERSISTENT:  # programs [0, p_programs) prefill, the rest decode, each looping
        is_prefill = pid < p_programs
        p_first, p_end, p_step = pid, p_work, p_programs
        d_first, d_end, d_step = pid - p_programs, d_work, d_programs
    else:  # one item per program; program p is prefill iff c(p + 1) > c(p), c(p) = p * P / N
        n = p_work + d_work
        c0 = (pid.to(tl.int64) * p_work // n).to(tl.int32)  # prefill items before p
        c1 = ((pid + 1).to(tl.int64) * p_work // n).to(tl.int32)
        is_prefill = c1 > c0
        p_first, p_end, p_step = c0, c0 + 1, 1
        d_first, d_end, d_step = pid - c0, pid - c0 + 1, 1
    if is_prefill:
        for w in range(p_first, p_end, p_step):
            prefill_tile(
                p_tiles - 1 - w // p_num_kv_heads, w % p_num_kv_heads,
                p_q_ptr, p_stride_qt, p_stride_qh,
                p_kv_ptr, p_stride_kv_block, p_stride_kv_kv, p_stride_kv_tok, p_stride_kv_head,
                p_bt_ptr, p_stride_bt, p_seq_lens_ptr, p_qsl_ptr,
                p_out_ptr, p_stride_ot, p_stride_oh, qk_scale, p_num_reqs, p_q_base,
                P_G, P_G_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, P_BLOCK_Q, P_BLOCK_M, P_BLOCK_N,
                UPCAST, PRECISION,
            )
    else:
        for w in range(d_first, d_end, d_step):
            split = w % d_num_splits
            bh = w // d_num_splits
            decode_split(
                bh // d_num_kv_heads, bh % d_num_kv_heads, split, d_num_kv_heads,
                d_q_ptr, d_stride_qb, d_stride_qh,
                d_kv_ptr, d_stride_kv_block, d_stride_kv_kv, d_stride_kv_tok, d_stride_kv_head,
                d_bt_ptr, d_stride_bt, d_seq_lens_ptr,
                d_pk_ptr, d_pv_ptr, d_stride_p_tok, d_stride_p_head, d_prefix_loc_ptr,
                d_out_ptr, d_stride_ob, d_stride_oh, d_part_ptr, d_lse_ptr,
                qk_scale, d_num_splits, d_min_split_tokens,
                D_G, D_G_PAD, HEAD_DIM, D_PAD, BLOCK_SIZE, D_BLOCK_N, D_SINGLE_SPLIT,
                D_HAS_PREFIX, UPCAST, PRECISION,
            )


@dataclass(frozen=True)
class FusedSplit:
    """How one fused launch was cut: for the benchmark's record and for tests."""

    prefill_programs: int
    decode_programs: int
    prefill_work: int  # (query tile, KV head) items
    decode_work: int  # (request, KV head, split) items
    decode_splits: int


def fused_paged_attention(
    prefill: PrefillProblem | None,
    decode: DecodeProblem | None,
    scale: float,
    *,
    persistent: bool = False,  # static SM split by the FLOP/byte ratio (see module doc)
    num_programs: int | None = None,  # persistent: total; default PROGRAMS_PER_SM per SM
    prefill_programs: int | None = None,  # persistent: override the FLOP/byte split
    prefill_block_m: int | None = None,
    prefill_block_n: int | None = None,
    decode_block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int = 2,
) -> tuple[torch.Tensor | None, torch.Tensor | None, FusedSplit]:
    """Runs both problems in one launch (plus the decode reduce when it splits).

    Returns (prefill out, decode out, the split used); an absent problem gives None. Both
    problems must share dtype, head_dim and block_size (same model, any two layers)."""
    check(prefill is not None or decode is not None, "nothing to run")
    first = prefill if prefill is not None else decode
    assert first is not None
    dtype, D, block_size = first.q.dtype, first.q.shape[2], first.kv_cache.shape[2]
    device = first.q.device
    for problem in (prefill, decode):
        if problem is not None:
            check(problem.q.dtype == dtype and problem.q.shape[2] == D
                  and problem.kv_cache.shape[2] == block_size,
                  "prefill and decode must share dtype, head_dim and block_size")

    p_out = d_out = None
    p_args: tuple = ()
    d_args: tuple = ()
    p_meta: dict = {}
    d_meta: dict = {}
    p_work = d_work = 0
    p_time = d_time = 0.0
    d_splits = d_max_splits = 1
    d_max_seq_len = 0
    p_warps = d_warps = 4

    if prefill is not None:
        q, kv = prefill.q, prefill.kv_cache
        p_out = check_prefill_args(q, kv, prefill.block_tables, prefill.seq_lens,
                                   prefill.query_start_loc, prefill.out)
        R, Hq, Hkv = prefill.seq_lens.shape[0], q.shape[1], kv.shape[3]
        num_tokens = prefill.num_tokens
        if num_tokens is None:
            num_tokens = q.shape[0] - prefill.q_base
        G, G_PAD = Hq // Hkv, next_pow2(Hq // Hkv)
        block_q, block_n = prefill_tile_shape(G, q, prefill_block_m, prefill_block_n)
        tiles = num_tiles(num_tokens, R, block_q) if R > 0 and num_tokens > 0 else 0
        p_work = tiles * Hkv
        flops = prefill.flops
        if flops is None and p_work > 0:
            qsl = prefill.query_start_loc.tolist()
            flops = prefill_flops([b - a for a, b in zip(qsl, qsl[1:])],
                                  prefill.seq_lens.tolist(), Hq, D)
        p_time = (flops or 0.0) / PREFILL_FLOPS_PER_S
        p_args = (
            q, q.stride(0), q.stride(1),
            kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
            prefill.block_tables, prefill.block_tables.stride(0),
            prefill.seq_lens, prefill.query_start_loc,
            p_out, p_out.stride(0), p_out.stride(1),
            R, prefill.q_base, Hkv, tiles, p_work,
        )
        p_meta = dict(P_G=G, P_G_PAD=G_PAD, P_BLOCK_Q=block_q, P_BLOCK_M=block_q * G_PAD,
                      P_BLOCK_N=block_n)
        p_warps = 8 if block_q * G_PAD >= 128 else 4

    if decode is not None:
        q, kv = decode.q, decode.kv_cache
        d_out = check_decode_args(q, kv, decode.block_tables, decode.seq_lens, decode.out,
                                  decode.prefix)
        B, Hq, Hkv = q.shape[0], q.shape[1], kv.shape[3]
        max_seq_len = decode.max_seq_len
        if max_seq_len is None and B > 0:
            max_seq_len = int(decode.seq_lens[:B].max())  # syncs; the hot path passes it
        d_splits = d_max_splits = decode.num_splits or 1
        block_n = decode_block_n or _default_block_n(D, dtype)
        G = Hq // Hkv
        d_meta = dict(D_G=G, D_G_PAD=max(16, next_pow2(G)), D_BLOCK_N=block_n,
                      D_HAS_PREFIX=decode.prefix is not None)
        nbytes = decode.bytes
        if nbytes is None and B > 0:
            nbytes = decode_bytes(decode.seq_lens[:B].tolist(), Hkv, D, q.element_size())
        d_time = (nbytes or 0.0) / DECODE_BYTES_PER_S
        d_work = B * Hkv  # (request, head) pairs; times the splits below
        d_max_seq_len = max_seq_len or 0
        if decode.num_splits is None:  # up to one split per MIN_TOKENS_PER_SPLIT tokens
            d_max_splits = max(1, triton.cdiv(d_max_seq_len, MIN_TOKENS_PER_SPLIT))

    if persistent:
        total = num_programs or PROGRAMS_PER_SM * num_sms(device)
        if prefill_programs is not None:
            p_progs = min(prefill_programs, p_work)
            d_progs = min(total - p_progs, d_work * d_max_splits)
        else:
            p_progs, d_progs = split_programs(p_time, d_time, total, p_work,
                                              d_work * d_max_splits)
        if d_work > 0 and decode is not None and decode.num_splits is None:
            # The fewest splits that give every decode program a work item: more splits
            # only add partial-output traffic.
            d_splits = min(d_max_splits, triton.cdiv(d_progs, d_work))
    elif d_work > 0 and decode is not None and decode.num_splits is None:
        # One program per item: split as the standalone decode would for the whole GPU.
        per_sm = programs_per_sm(d_meta["D_BLOCK_N"], D, dtype.itemsize, num_stages)
        d_splits = default_num_splits(d_work, 1, d_max_seq_len, num_sms(device), per_sm)
    d_work *= d_splits
    if persistent:
        d_progs = min(max(d_progs, 1), d_work) if d_work else 0
    else:
        p_progs, d_progs = p_work, d_work
    split = FusedSplit(p_progs, d_progs, p_work, d_work, d_splits)
    if p_progs + d_progs == 0:
        return p_out, d_out, split

    if decode is not None:
        assert d_out is not None
        q, kv = decode.q, decode.kv_cache
        part, lse = split_partials(d_out, d_splits)
        prefix = decode.prefix
        pk = prefix.k if prefix is not None else q
        pv = prefix.v if prefix is not None else q
        ploc = prefix.start_loc if prefix is not None else decode.seq_lens
        d_args = (
            q, q.stride(0), q.stride(1),
            kv, kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3),
            decode.block_tables, decode.block_tables.stride(0), decode.seq_lens,
            pk, pv, pk.stride(0), pk.stride(1), ploc,
            d_out, d_out.stride(0), d_out.stride(1), part, lse,
            kv.shape[3], d_splits, MIN_TOKENS_PER_SPLIT, d_work,
        )
        d_meta["D_SINGLE_SPLIT"] = d_splits == 1
    # An absent part gets the present part's tensors as placeholders and no programs.
    if prefill is None:
        q, kv = d_args[0], d_args[3]
        p_args = (q, 0, 0, kv, 0, 0, 0, 0, d_args[8], 0, d_args[10], d_args[10],
                  q, 0, 0, 0, 0, 1, 0, 0)
        g_pad = d_meta["D_G_PAD"]
        p_meta = dict(P_G=d_meta["D_G"], P_G_PAD=g_pad, P_BLOCK_Q=1, P_BLOCK_M=g_pad,
                      P_BLOCK_N=16)
    if decode is None:
        q, kv = p_args[0], p_args[3]
        d_args = (q, 0, 0, kv, 0, 0, 0, 0, p_args[8], 0, p_args[10],
                  q, q, 0, 0, p_args[10], q, 0, 0, q, q, 1, 1, 1, 0)
        d_meta = dict(D_G=p_meta["P_G"], D_G_PAD=max(16, p_meta["P_G_PAD"]), D_BLOCK_N=16,
                      D_HAS_PREFIX=False, D_SINGLE_SPLIT=True)

    _fused_attention_kernel[(p_progs + d_progs,)](
        *p_args, p_progs, *d_args, d_progs,
        scale * LOG2E,
        HEAD_DIM=D, D_PAD=next_pow2(D), BLOCK_SIZE=block_size,
        UPCAST=upcast(dtype), PRECISION=dot_precision(dtype),
        **p_meta, **d_meta,
        PERSISTENT=persistent,
        num_warps=num_warps or max(p_warps, d_warps), num_stages=num_stages,
    )
    if decode is not None and d_splits > 1:
        assert d_out is not None
        reduce_splits(part, lse, d_out, decode.seq_lens, MIN_TOKENS_PER_SPLIT)
    return p_out, d_out, split


def fused_paged_attention_ref(
    prefill: PrefillProblem | None, decode: DecodeProblem | None, scale: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Pure torch: the two standalone references, one after the other."""
    p_out = d_out = None
    if prefill is not None:
        p_out = paged_prefill_attention_ref(prefill.q, prefill.kv_cache, prefill.block_tables,
                                            prefill.seq_lens, prefill.query_start_loc, scale)
    if decode is not None:
        d_out = paged_decode_attention_ref(decode.q, decode.kv_cache, decode.block_tables,
                                           decode.seq_lens, scale, decode.prefix)
    return p_out, d_out
