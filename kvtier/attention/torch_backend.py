"""Pure-torch paged attention: the CPU path and the oracle for the Triton kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvtier.attention.base import Rope
from kvtier.attention.metadata import AttentionMetadata
from kvtier.model.ops import TorchOps


def write_kv(
    layer_cache: torch.Tensor,  # [num_blocks, 2, block_size, H, D] (a strided layer view)
    k: torch.Tensor,  # [T, H, D]
    v: torch.Tensor,
    slots: torch.Tensor,  # [T] int64
) -> None:
    block_size = layer_cache.shape[2]
    blocks, offsets = slots // block_size, slots % block_size
    layer_cache[blocks, 0, offsets] = k.to(layer_cache.dtype)
    layer_cache[blocks, 1, offsets] = v.to(layer_cache.dtype)


def gather_kv(
    layer_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's contiguous K and V ([seq_len, H, D]) from its block table row."""
    kv = layer_cache[block_ids]  # [nb, 2, bs, H, D]
    h, d = kv.shape[-2:]
    k = kv[:, 0].reshape(-1, h, d)[:seq_len]
    v = kv[:, 1].reshape(-1, h, d)[:seq_len]
    return k, v


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal attention of q ([q_len, Hq, D]) at the last q_len positions of k/v ([s, Hkv, D])."""
    q_len, s = q.shape[0], k.shape[0]
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
    # Query i sits at absolute position s - q_len + i and sees keys 0..that position.
    mask = torch.ones(q_len, s, dtype=torch.bool, device=q.device).tril(diagonal=s - q_len)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1).to(q.dtype), v.transpose(0, 1).to(q.dtype),
        attn_mask=mask, scale=scale,
    )
    return out.transpose(0, 1)


_OPS = TorchOps()  # stateless: the model's rotary, for `rope`


class TorchAttentionBackend:
    name = "torch"
    fuses_rotary = False  # `rope` is honoured, by the model's own rotary beforehand

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,
        rope: Rope | None = None,
    ) -> torch.Tensor:
        if rope is not None:
            q, k = _OPS.rotary(q, k, rope.positions, rope.cos_sin_cache)
        group, slot = meta.layer_slot(layer_idx)
        layer_cache = kv_cache[:, slot]
        if out is None:
            out = torch.empty_like(q)
        first = 0  # rows [0, first) are the memory system's (ExternalRows)
        if meta.external is not None:
            first = meta.external.num_rows
            meta.external.forward(layer_idx, q, k, v, scale, out, None)
        write_kv(layer_cache, k[first:], v[first:], meta.slot_mapping[group][first:])
        start = first
        for b, (q_len, seq_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            if b < first:
                continue
            nb = -(-seq_len // meta.block_size)
            kb, vb = gather_kv(layer_cache, meta.block_tables[group, b, :nb].long(), seq_len)
            out[start : start + q_len] = attend(q[start : start + q_len], kb, vb, scale)
            start += q_len
        if meta.external is not None:
            meta.external.join(layer_idx)
        return out
