"""The model of one tensor-parallel rank: kvtier/model/llama.py built with the rank's shapes
(`TPShard.config`: its heads, KV heads and MLP columns), a vocab-parallel embedding and LM
head, and the row-parallel all-reduces.

Where the all-reduces run: o and down are row-parallel, so each rank's output is a partial
sum, and in the Llama layer every such output goes straight into `fused_add_rms_norm`, where
it joins the residual stream (after o: the post-attention norm; after down: the next layer's
input norm or the final norm). `AllReduceOps` sums it over the ranks there, so the layer code
is the single-GPU one, and eager forwards, piecewise graphs and full-model graphs all run
(and capture) the same collectives. No other caller of fused_add_rms_norm runs on a TP rank.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from kvtier.distributed.parallel_state import TPGroup
from kvtier.distributed.sharding import TPShard
from kvtier.model.llama import LlamaForCausalLM


class AllReduceOps:
    """The runner's elementwise ops (torch or Triton) with the row-parallel all-reduce in
    front of `fused_add_rms_norm` (see the module docstring)."""

    def __init__(self, ops: Any, group: TPGroup):
        self._ops, self._group = ops, group
        self.name = ops.name

    def fused_add_rms_norm(self, x: torch.Tensor, residual: torch.Tensor,
                           weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
        return self._ops.fused_add_rms_norm(self._group.all_reduce(x), residual, weight, eps)

    def __getattr__(self, name: str) -> Any:  # every other op is the rank-local one
        return getattr(self._ops, name)


class VocabParallelLlama(LlamaForCausalLM):
    """One rank's shard: the layers of `shard.config()`, `vocab_per_rank` rows of the
    embedding (and of the LM head, or the tied embedding)."""

    def __init__(self, shard: TPShard, dtype: torch.dtype, group: TPGroup | None):
        cfg = shard.config()
        super().__init__(replace(cfg, vocab_size=shard.vocab_per_rank), dtype)
        self.cfg = cfg  # the whole vocabulary: what the gathered logits cover
        self.shard, self.group = shard, group
        vocab = shard.vocab()
        self.vocab_start, self.vocab_len = vocab.start, len(vocab)

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Each rank looks up the ids in its rows (zeros elsewhere); the sum over ranks is
        the embedding. No host sync: capturable in a CUDA graph."""
        local = input_ids - self.vocab_start
        mine = (local >= 0) & (local < self.vocab_len)
        x = F.embedding(torch.where(mine, local, 0), self.embed)
        x = x * mine.unsqueeze(-1).to(x.dtype)
        assert self.group is not None
        return self.group.all_reduce(x)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """Every rank's logits of its vocabulary rows, gathered on every rank: [n, vocab].
        All ranks then hold the same logits, bit for bit (the gather copies, and an
        all-reduce gives every rank the same sum)."""
        head = self.embed if self.lm_head is None else self.lm_head
        assert self.group is not None
        parts = self.group.all_gather_rows(torch.mm(hidden, head.t()))  # [N, n, V/N]
        n = hidden.shape[0]
        logits = parts.permute(1, 0, 2).reshape(n, -1)[:, : self.cfg.vocab_size]
        if out is None:
            return logits
        return out.copy_(logits)
