"""Triton paged attention: kv_write, then split-K decode for the leading decode rows and the
varlen prefill kernel for the rest. Same contract as `TorchAttentionBackend` (the oracle)."""

from __future__ import annotations

import torch

from kvtier.attention.metadata import AttentionMetadata
from kvtier.kernels.kv_write import kv_write
from kvtier.kernels.paged_decode_attention import paged_decode_attention
from kvtier.kernels.paged_prefill_attention import paged_prefill_attention


class TritonAttentionBackend:
    name = "triton"

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, F, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        group, slot = meta.layer_slot(layer_idx)
        layer_cache = kv_cache[:, slot]  # [num_blocks, 2, block_size, Hkv, D], strided
        block_tables = meta.block_tables[group]  # [num_reqs, max_blocks]
        n = meta.num_tokens
        kv_write(layer_cache, k[:n], v[:n], meta.slot_mapping[group])
        out = torch.empty_like(q)
        nd = meta.num_decodes  # decode rows come first, one token each: tokens [0, nd)
        if nd > 0:
            paged_decode_attention(
                q[:nd], layer_cache, block_tables[:nd], meta.seq_lens[:nd], scale,
                out=out[:nd], max_seq_len=meta.max_seq_len,
            )
        if nd < meta.num_reqs:
            paged_prefill_attention(
                q, layer_cache, block_tables[nd:], meta.seq_lens[nd:],
                meta.query_start_loc[nd:], scale,
                num_tokens=n - nd, q_base=nd, out=out,
            )
        return out
