"""Pure-torch paged attention: the CPU path and the oracle for the Triton kernels."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvtier.attention.metadata import AttentionMetadata


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
    layer_cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's contiguous K and V of positions [start, seq_len) ([n, H, D]) from its
    block table row (indexed by absolute position; blocks before `start` are not read)."""
    bs = layer_cache.shape[2]
    first = start // bs
    kv = layer_cache[block_ids[first:]]  # [nb, 2, bs, H, D]
    h, d = kv.shape[-2:]
    k = kv[:, 0].reshape(-1, h, d)[start - first * bs : seq_len - first * bs]
    v = kv[:, 1].reshape(-1, h, d)[start - first * bs : seq_len - first * bs]
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


class TorchAttentionBackend:
    name = "torch"

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        group, slot = meta.layer_slot(layer_idx)
        layer_cache = kv_cache[:, slot]
        n = meta.num_tokens
        write_kv(layer_cache, k[:n], v[:n], meta.slot_mapping[group])
        out = torch.empty_like(q)
        prefix_lens = meta.prefix_lens_cpu or [0] * meta.num_reqs
        start, p0 = 0, n
        for b, (q_len, seq_len) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu)):
            s = prefix_lens[b]
            nb = -(-seq_len // meta.block_size)
            kb, vb = gather_kv(layer_cache, meta.block_tables[group, b, :nb].long(), seq_len, s)
            if s:  # recomputed prefix: causal among itself, then a source for the main rows
                pk, pv = k[p0 : p0 + s], v[p0 : p0 + s]
                out[p0 : p0 + s] = attend(q[p0 : p0 + s], pk, pv, scale)
                kb, vb = torch.cat((pk.to(kb.dtype), kb)), torch.cat((pv.to(vb.dtype), vb))
                p0 += s
            out[start : start + q_len] = attend(q[start : start + q_len], kb, vb, scale)
            start += q_len
        return out
