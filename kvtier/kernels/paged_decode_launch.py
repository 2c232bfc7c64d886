"""Launch shape of the split-K decode kernel (kvtier/kernels/paged_decode_attention.py): how
many splits a decode takes, the shortest range a request is split into, and its tiles.

Launch shape (`default_tiles`): 64-token K/V tiles, 4 warps, 3 stages (2 programs resident
an SM). Grouped-query launches of 1,024 to 4,095 programs take 2 warps and 4 stages (one
resident an SM, as many bytes in flight): as fast alone, and at the H200's power cap they
leave the step's GEMMs a higher clock. From 4,096 programs on they take 32-token tiles with
2 warps (4 resident), where many short programs wait on their first loads. Few programs
split finer (`default_min_split_tokens`).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from kvtier.kernels.launch import num_sms

# Below this many tokens per split, the extra partial outputs and the reduce cost more than
# the parallelism gains: the cap of a launch's split count, and of each request's own where
# the batch's programs fill the GPU (`default_min_split_tokens`: shorter where they do not).
MIN_TOKENS_PER_SPLIT = 256
# From this many waves of (request, KV head) programs on, the decode does not split.
SPLIT_FREE_WAVES = 3
MAX_SPLITS = 64


def default_num_splits(batch: int, num_kv_heads: int, max_seq_len: int, sms: int,
                       programs_per_sm: int = 2) -> int:
    """The split count whose (request, head, split) programs fill the GPU in whole waves.

    On the H200 (results/kernels/kernels_h200_run1.json, sweep), with 2 resident programs
    per SM, a partly filled last wave idles SMs and costs far more bandwidth than a whole
    one; a single wave ramps poorly; and every split adds partial-output traffic and a
    reduce. So: the fewest splits that keep most of the slots busy, else the best trade-off;
    never fewer than MIN_TOKENS_PER_SPLIT tokens a split.

    That wave arithmetic holds for equal contexts. Served batches mix lengths, which smears
    the last wave, and a decode graph fixes its split count from max_model_len, not from the
    lengths it will meet: over mixed contexts one split beat the graph's few from about a
    hundred requests up and lost only at small batches of long contexts
    (kernels_mixed_context_h200.json). So from SPLIT_FREE_WAVES waves of programs on: one.
    Three, not two: at two, llama-2-13b's 16 x 40 programs ran unsplit well below the
    bandwidth two splits reach (kernels_h200_456b8b1.json vs kernels_h200_waves3.json), and
    the offline ShareGPT run did not move (offline_waves{2,3}_{1,2}.json).
    """
    programs = batch * num_kv_heads
    slots = sms * programs_per_sm
    if programs >= SPLIT_FREE_WAVES * slots:
        return 1
    useful = max(1, min(MAX_SPLITS, triton.cdiv(max_seq_len, MIN_TOKENS_PER_SPLIT)))
    best, best_score = 1, -1.0
    for splits in range(1, useful + 1):
        waves = programs * splits / slots
        busy = waves / math.ceil(waves) * min(1.0, 0.9 + 0.05 * waves)
        if busy >= 0.95:
            return splits
        score = busy * (1 - 0.003 * splits)
        if score > best_score:
            best, best_score = splits, score
    return best


def default_min_split_tokens(batch: int, num_kv_heads: int, sms: int,
                             programs_per_sm: int = 2) -> int:
    """The shortest range a request is split into, by how few (request, KV head) programs
    the batch has. MIN_TOKENS_PER_SPLIT where they fill the resident slots; where they do
    not, the kernel runs one short wave whose time is the programs' latency more than their
    bytes, and shorter ranges start more of them at once: on the offline ShareGPT run's last
    steps a handful of requests ran fastest at 64-128-token ranges, and from two waves of
    programs on shorter ranges gained nothing (kernels_sharegpt_tail_h200_{5b122b0,dff8709}.json)."""
    programs = batch * num_kv_heads
    if programs <= 16:
        return 64
    if programs < sms * programs_per_sm:
        return 128
    return MIN_TOKENS_PER_SPLIT


@dataclass(frozen=True)
class DecodeTiles:
    """Launch shape of the decode kernel: tokens per K/V tile, warps, pipeline stages."""

    block_n: int
    num_warps: int
    num_stages: int


# From this many (request, KV head) programs on (~15 waves at 2 resident a SM on the H200),
# a grouped-query decode launches 32-token tiles with 2 warps (4 resident a SM) instead of
# 64-token tiles with 4: on the offline ShareGPT run's contexts many short requests gained
# and fewer, longer ones lost (kernels_tiles_h200.json). Many short programs gain from more
# of them resident: one of ~100 tokens is mostly the latency of its first loads.
MANY_PROGRAMS = 4096
MANY_PROGRAMS_TILES = DecodeTiles(block_n=32, num_warps=2, num_stages=3)

# From this many programs on (~8 waves at one resident an SM: always a single split), 2 warps
# and 4 stages. The step's attention streams the KV at HBM speed with either shape, but under
# the H200's 700 W cap the attention's SM work takes power from the compute-bound GEMMs of the
# same step: at 256 x 2048 the board held a higher clock and the step was shorter
# (step_tiles_h200_1f8b93b.json; at 64 x 2048 even). Fewer programs keep the default: there
# one resident an SM leaves too few bytes in flight (step_tiles_h200_stages_d881543.json).
LARGE_PROGRAMS = 1024
LARGE_PROGRAMS_TILES = DecodeTiles(block_n=64, num_warps=2, num_stages=4)


@functools.cache  # asked once per layer on the eager path: one answer per problem shape
def default_tiles(batch: int, num_heads: int, num_kv_heads: int, head_dim: int,
                  dtype: torch.dtype) -> DecodeTiles:
    """The launch shape of a decode over `batch` requests (measured for grouped-query bf16
    at head dim 128; other problems keep the default tiles)."""
    programs = batch * num_kv_heads
    if num_heads > num_kv_heads and head_dim == 128 and dtype in (torch.bfloat16, torch.float16):
        if programs >= MANY_PROGRAMS:
            return MANY_PROGRAMS_TILES
        if programs >= LARGE_PROGRAMS:
            return LARGE_PROGRAMS_TILES
    return DecodeTiles(_default_block_n(head_dim, dtype), num_warps=4, num_stages=3)


def tiles_for(q: torch.Tensor, kv_cache: torch.Tensor) -> DecodeTiles:
    """`default_tiles` of a decode problem: q [B, Hq, D] over a layer's pool view."""
    B, Hq, D = q.shape
    return default_tiles(B, Hq, kv_cache.shape[3], D, q.dtype)


def choose_num_splits(q: torch.Tensor, kv_cache: torch.Tensor, max_seq_len: int,
                      block_n: int | None = None, num_stages: int | None = None) -> int:
    """The split count `paged_decode_attention` picks for this problem when given none (a
    caller launching the same problem for every layer computes it once)."""
    B, _, D = q.shape
    if block_n is None or num_stages is None:
        tiles = tiles_for(q, kv_cache)
        block_n, num_stages = block_n or tiles.block_n, num_stages or tiles.num_stages
    per_sm = programs_per_sm(block_n, D, q.element_size(), num_stages)
    return default_num_splits(B, kv_cache.shape[3], max_seq_len, num_sms(q.device), per_sm)


def programs_per_sm(block_n: int, head_dim: int, elem_bytes: int, num_stages: int) -> int:
    """Resident decode programs per SM, bounded by shared memory (K and V tiles per stage)."""
    smem = num_stages * 2 * block_n * triton.next_power_of_2(head_dim) * elem_bytes
    return max(1, min(8, (227 * 1024) // smem))


def _default_block_n(head_dim: int, dtype: torch.dtype) -> int:
    # 64 tokens x 128 dims x 2 B = 16 KiB per K tile: several tiles in flight per SM with
    # num_stages=3, and 4 pages of 16 per iteration. fp32 (tests) halves it for shared memory.
    n = 64 if head_dim > 64 else 128
    return n // 2 if dtype == torch.float32 else n
