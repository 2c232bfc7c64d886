"""Compile every Triton variant an eager attention call can pick, before serving starts.

A step with prefill rows runs attention eagerly (between graph pieces), and the split-K decode
kernel's variant depends on the step: one split or several (`SINGLE_SPLIT`), and the merge
kernel is specialized on the split count's power of two. Whichever variant a step meets first
would otherwise be compiled inside that step, a TTFT spike for the first requests
(results/fidelity/fidelity_real_h200.json). Each call here reads one scratch block that no
request owns and writes nothing to the pool (negative slots are skipped by kv_write and
rotary_kv_write).
"""

from __future__ import annotations

import torch

from kvtier.kernels.kv_write import kv_write
from kvtier.kernels.paged_decode_attention import paged_decode_attention
from kvtier.kernels.paged_decode_launch import (
    LARGE_PROGRAMS,
    MANY_PROGRAMS,
    MAX_SPLITS,
    default_tiles,
)
from kvtier.kernels.paged_prefill_attention import paged_prefill_attention
from kvtier.kernels.rotary_kv_write import rotary_kv_write


def split_counts_to_warm(max_splits: int = MAX_SPLITS) -> list[int]:
    """1, then one split count per power-of-two class of the merge kernel: 2, 3, 5, 9, ..."""
    counts, n = [1], 2
    while n <= max_splits:
        counts.append(n)
        n = 2 * n - 1 if n > 2 else 3
    return counts


@torch.inference_mode()
def warm_up_attention(layer_kv: torch.Tensor, scratch_block: int, num_heads: int,
                      scale: float) -> None:
    """`layer_kv`: one layer's view of the device pool, [num_blocks, 2, block_size, Hkv, D]."""
    _, _, block_size, num_kv_heads, head_dim = layer_kv.shape
    dev, dt = layer_kv.device, layer_kv.dtype
    q = torch.zeros(2, num_heads, head_dim, dtype=dt, device=dev)
    k = torch.zeros(2, num_kv_heads, head_dim, dtype=dt, device=dev)
    n = min(2, block_size)  # context of each row: inside the one scratch block
    tables = torch.full((2, 1), scratch_block, dtype=torch.int32, device=dev)
    seq_lens = torch.full((2,), n, dtype=torch.int32, device=dev)
    no_slots = torch.full((2,), -1, dtype=torch.int64, device=dev)
    kv_write(layer_kv, k, k, no_slots)
    positions = torch.zeros(2, dtype=torch.int64, device=dev)
    cos_sin = torch.zeros(1, head_dim, dtype=torch.float32, device=dev)
    rotary_kv_write(q, k, k, positions, cos_sin, layer_kv, no_slots)
    for splits in split_counts_to_warm():
        paged_decode_attention(q, layer_kv, tables, seq_lens, scale, num_splits=splits,
                               max_seq_len=n)
    # The launches of a step's decode rows: in longest-first order, and (at many rows) with
    # the tiles of the large batches, which do not split.
    order = torch.arange(2, dtype=torch.int32, device=dev)
    paged_decode_attention(q, layer_kv, tables, seq_lens, scale, num_splits=1, max_seq_len=n,
                           order=order)
    for programs in (LARGE_PROGRAMS, MANY_PROGRAMS):
        big = default_tiles(programs, num_heads, num_kv_heads, head_dim, dt)
        for o in (None, order):
            paged_decode_attention(q, layer_kv, tables, seq_lens, scale, num_splits=1,
                                   max_seq_len=n, order=o, block_n=big.block_n,
                                   num_warps=big.num_warps, num_stages=big.num_stages)
    qsl = torch.tensor([0, n], dtype=torch.int32, device=dev)
    paged_prefill_attention(q[:n], layer_kv, tables[:1], seq_lens[:1], qsl, scale, num_tokens=n)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
