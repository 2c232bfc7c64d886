"""What a ModelRunner needs to be one tensor-parallel rank (its `tp`): the sharded model, the
ops with the row-parallel all-reduce, and sampling on rank 0 with the tokens broadcast."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvtier.config import ModelConfig
from kvtier.distributed.layers import AllReduceOps, VocabParallelLlama
from kvtier.distributed.loading import build_sharded_model
from kvtier.distributed.parallel_state import TPGroup
from kvtier.distributed.sharding import TPShard
from kvtier.runner.penalties import PenaltyView
from kvtier.runner.sampler import Sampled, SampleRow, Upload, sample


class TPRank:
    def __init__(self, group: TPGroup):
        self.group = group

    @property
    def rank(self) -> int:
        return self.group.rank

    @property
    def size(self) -> int:
        return self.group.size

    def build_model(self, mc: ModelConfig, ckpt: Path | None, dtype: torch.dtype,
                    device: torch.device, seed: int) -> tuple[ModelConfig, VocabParallelLlama]:
        """(this rank's architecture: its heads, KV heads and MLP columns; its model)."""
        shard = TPShard(mc, self.rank, self.size)
        return shard.config(), build_sharded_model(shard, ckpt, dtype, device, seed, self.group)

    def wrap_ops(self, ops: Any) -> AllReduceOps:
        return AllReduceOps(ops, self.group)

    def sample(self, logits: torch.Tensor, rows: list[SampleRow],
               upload: Upload | None = None, penalties: PenaltyView | None = None) -> Sampled:
        """Rank 0 samples (its random draws alone count); every rank gets its tokens, which
        the others need on the device for the next step's in-flight placeholders. Logprobs
        stay on rank 0, the only rank whose result the engine reads. (Plain greedy batches
        skip this: every rank takes the argmax of the same gathered logits.)"""
        n = logits.shape[0]
        tokens = torch.empty(n, dtype=torch.int64, device=logits.device)
        out = sample(logits, rows, upload, penalties) if self.group.is_driver else None
        if out is not None:
            drawn = np.asarray(out.token_ids, dtype=np.int64)
            tokens.copy_(upload(drawn) if upload is not None else torch.from_numpy(drawn))
        self.group.broadcast_from_driver(tokens)
        return out if out is not None else Sampled(tokens.tolist(), [None] * n)
