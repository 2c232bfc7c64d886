"""What the runner calls of a store that keeps every computed token's per-layer attention
input (Placement.HIDDEN: hidden states stand in for KV). The memory system that keeps hidden
states builds one and attaches it (`ModelRunner.attach_layer_inputs`); the runner calls it
at fixed points of a step, in this order: `forget` (finished/preempted rows) → `apply` (the
plan's HiddenBlocks) → `restore` (the plan's HiddenRestores: rebuild KV into the device pool,
after every copy) → `sink` (the forward's per-layer hook) → `store` (after the forward)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from kvtier.core.plan import HiddenBlocks, HiddenRestore, ScheduledRequest
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.host_batch import HostBatch


class LayerInputStore(Protocol):
    def forget(self, request_id: str) -> None: ...

    def apply(self, blocks: Sequence[HiddenBlocks]) -> None: ...

    def restore(self, restores: Sequence[HiddenRestore], block_tables: BlockTables,
                gpu_kv: torch.Tensor, ops: Any, cos_sin: torch.Tensor,
                layers_per_block: int) -> None: ...

    def sink(self, num_tokens: int) -> Callable[[int, torch.Tensor], None]: ...

    def store(self, scheduled: list[ScheduledRequest], batch: HostBatch) -> None: ...
