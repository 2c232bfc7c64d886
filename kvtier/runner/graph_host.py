"""What the CUDA graph captures read from the runner that owns them.

`DecodeGraphs` and `PiecewiseGraphs` run the runner's model over its KV pool and block
tables, so they need its live state, but they are parts of the runner: naming this small
surface instead of `ModelRunner` keeps them below it (the runner imports them, never the
reverse) and says exactly what a capture may touch. `ModelRunner` satisfies it structurally.
"""

from __future__ import annotations

from typing import Protocol

import torch

from kvtier.attention.base import AttentionBackend
from kvtier.config import EngineConfig, ModelConfig
from kvtier.model.llama import LlamaForCausalLM
from kvtier.model.ops import TorchOps
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.staging import PinnedStaging


class GraphHost(Protocol):
    config: EngineConfig
    model_config: ModelConfig
    device: torch.device
    dtype: torch.dtype
    model: LlamaForCausalLM
    ops: TorchOps
    attention: AttentionBackend
    cos_sin: torch.Tensor  # [max_model_len, head_dim]: rotary cos, then sin
    gpu_kv: torch.Tensor | None  # the device KV pool; set before any capture
    block_size: int
    layers_per_block: int
    num_groups: int
    block_tables: BlockTables
    staging: PinnedStaging  # pinned host buffers for a step's inputs

    @property
    def graph_sizes(self) -> list[int]:
        """The padded decode batch sizes that get a full-model graph."""
        ...
