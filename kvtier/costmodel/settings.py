"""The cost model's settings: how the runner executes an EngineConfig's steps (graphs,
pieces, copy overlap, what the memory system says of its steps)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True)
class CostModelConfig:
    cuda_graphs: bool = True  # CUDA graphs allowed (the runner's default on a GPU)
    # Decode-only steps replay a full-model graph; off for a memory system whose steps all
    # replay pieces (one that hands each layer's attention input to the host between them).
    decode_graphs: bool = True
    max_num_seqs: int = 256  # graphs are captured for padded batches up to this
    max_graph_batch_size: int = 512  # EngineConfig's: and no larger
    block_bytes: int = 0  # one KV block (CacheConfig.block_bytes), for swap copies
    num_gpus: int = 1  # tensor parallel degree
    # Steps with prefill rows replay piecewise graphs (EngineConfig.piecewise_graphs; only
    # with cuda_graphs, as the runner captures them) at padded token counts up to this:
    piecewise_graphs: bool = False
    max_num_batched_tokens: int = 8192  # SchedulerConfig's: the largest piecewise size
    # Swap copies overlap the forward per layer group (EngineConfig.overlap_swap; the runner's
    # default is on, off here so hand-built models keep the serial pricing they were fit with):
    overlap_swap: bool = False
    layers_per_block: int = 0  # CacheConfig.layers_in_block: the copies' layer groups (0: one)
    # Offloaded dropped prefixes: copied groups in flight at once (0: all)
    prefix_copy_window: int = 0


def engine_cost_config(config, block_bytes: int, num_gpus: int = 1,
                       system_options: Mapping[str, Any] | None = None) -> CostModelConfig:
    """The cost-model settings that mirror how the runner executes this EngineConfig:
    graphs unless eager; pieces when enabled; swap copies overlapped per group; and
    `system_options`, the CostModelConfig fields its memory system sets
    (`MemorySystem.cost_model_options`; `kvtier.policies.system_cost_config` passes them)."""
    mc, sched = config.model_config, config.scheduler
    return replace(CostModelConfig(
        cuda_graphs=not config.enforce_eager,
        max_num_seqs=sched.max_num_seqs, block_bytes=block_bytes, num_gpus=num_gpus,
        max_graph_batch_size=config.max_graph_batch_size,
        piecewise_graphs=config.piecewise_graphs,
        max_num_batched_tokens=sched.max_num_batched_tokens,
        overlap_swap=config.overlap_swap,
        layers_per_block=config.cache.layers_in_block(mc.num_layers)),
        **(system_options or {}))
