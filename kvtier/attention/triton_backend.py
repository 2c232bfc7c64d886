"""Triton paged attention: the KV write (with rotary fused in, the model leaving q and k
unrotated for it), then split-K decode for the leading decode rows and the varlen prefill
kernel for the rest. Same contract as `TorchAttentionBackend` (the oracle).

A step calls this once per layer with the same metadata; the views and launch parameters
that depend only on the step (per layer group: block tables, slots; the decode split
count) are derived on the first call and kept in `meta.derived`. Steps with prefill rows
issue their attention eagerly between graph pieces, so this host time is theirs."""

from __future__ import annotations

import torch

from kvtier.attention.base import Rope
from kvtier.attention.metadata import AttentionMetadata
from kvtier.kernels.kv_write import kv_write
from kvtier.kernels.paged_decode_attention import paged_decode_attention
from kvtier.kernels.paged_decode_launch import choose_num_splits
from kvtier.kernels.paged_prefill_attention import paged_prefill_attention
from kvtier.kernels.rotary_kv_write import rotary_kv_write


class _StepViews:
    """Per-step views, built lazily: layer slots of the pool, per-group tables and slots."""

    def __init__(self, meta: AttentionMetadata, kv_cache: torch.Tensor):
        # What it reads of meta, not meta: meta holds these views, and a cycle would keep a
        # finished step's metadata (and the memory system's rows it names, their host pages
        # with them) until the collector ran.
        self.kv_cache = kv_cache
        self.num_decodes = meta.num_decodes
        self.block_tables, self.slot_mapping = meta.block_tables, meta.slot_mapping
        self.layers: dict[int, torch.Tensor] = {}
        self.groups: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        nd = meta.num_decodes
        self.decode_lens = meta.seq_lens[:nd]
        self.prefill_lens = meta.seq_lens[nd:]
        self.prefill_starts = meta.query_start_loc[nd:]
        self.num_splits: int | None = None

    def layer(self, slot: int) -> torch.Tensor:
        """[num_blocks, 2, block_size, Hkv, D], strided: one layer's view of the pool."""
        view = self.layers.get(slot)
        if view is None:
            view = self.layers[slot] = self.kv_cache[:, slot]
        return view

    def group(self, g: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(decode rows' tables, prefill rows' tables, slot mapping) of layer group g."""
        views = self.groups.get(g)
        if views is None:
            nd = self.num_decodes
            tables = self.block_tables[g]
            views = self.groups[g] = (tables[:nd], tables[nd:], self.slot_mapping[g])
        return views


def step_views(meta: AttentionMetadata, kv_cache: torch.Tensor) -> _StepViews:
    views = meta.derived.get("triton")
    if views is None or views.kv_cache is not kv_cache:
        views = meta.derived["triton"] = _StepViews(meta, kv_cache)
    return views


class TritonAttentionBackend:
    name = "triton"
    fuses_rotary = True  # one launch rotates q and k and stores k/v (rotary_kv_write)

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, F, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
        rope: Rope | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        group, slot = meta.layer_slot(layer_idx)
        step = step_views(meta, kv_cache)
        layer_cache = step.layer(slot)  # [num_blocks, 2, block_size, Hkv, D], strided
        decode_tables, prefill_tables, slots = step.group(group)
        n = meta.num_tokens
        if out is None:
            out = torch.empty_like(q)
        first = 0  # decode rows [0, first) are the memory system's; their slots are < 0
        if meta.external is not None:
            first = meta.external.num_rows
            meta.external.forward(layer_idx, q, k, v, scale, out, rope)
        if rope is None:
            kv_write(layer_cache, k[:n], v[:n], slots)
        else:
            q = rotary_kv_write(q, k, v, rope.positions, rope.cos_sin_cache, layer_cache, slots,
                                num_kv_tokens=n)
        nd = meta.num_decodes  # decode rows come first, one token each: tokens [0, nd)
        if nd > first:
            qd = q[first:nd]
            if step.num_splits is None:
                step.num_splits = choose_num_splits(qd, layer_cache, meta.max_seq_len)
            paged_decode_attention(
                qd, layer_cache, decode_tables[first:], step.decode_lens[first:], scale,
                out=out[first:nd], max_seq_len=meta.max_seq_len, num_splits=step.num_splits,
                order=meta.decode_order if not first else None,
            )
        if nd < meta.num_reqs:
            paged_prefill_attention(
                q, layer_cache, prefill_tables, step.prefill_lens, step.prefill_starts, scale,
                num_tokens=n - nd, q_base=nd, out=out,
            )
        if meta.external is not None:
            meta.external.join(layer_idx)
        return out
