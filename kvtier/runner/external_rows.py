"""The runner's seam for a memory system that keeps the KV of some running requests outside
the device pool and attends for them itself (kvtier/attention/base.py, ExternalRows).

The system attaches one source (`ModelRunner.attach_external_attention`, from its
`prepare_executor` hook). Each step, after the batch is built and before its device inputs
are uploaded, the runner asks it for the step's external rows; the source may set those
rows' slots in `batch.slots` (the host arrays) to -1 so that no KV write touches the device
pool for them. A decode-only step with external rows replays a full-model decode graph
where the source hands over rows a graph can replay (`graph_rows`: the same attention, its
inputs in buffers that stay where they are); otherwise it runs through the source's own
forward (`run_forward`) or else the piecewise or the eager one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

import torch

from kvtier.attention.base import ExternalRows
from kvtier.attention.metadata import AttentionMetadata
from kvtier.core.items import PlanItem
from kvtier.core.plan import ScheduledRequest
from kvtier.runner.host_batch import HostBatch


class ExternalAttentionSource(Protocol):
    def for_step(self, scheduled: Sequence[ScheduledRequest], batch: HostBatch,
                 items: Mapping[type[PlanItem], Sequence[PlanItem]]) -> ExternalRows | None:
        """This step's external rows (its leading decode rows), or None for none."""
        ...

    def run_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    meta: AttentionMetadata) -> torch.Tensor | None:
        """The step's forward, run by the source itself (final hidden states of every row,
        [num_tokens, hidden]; e.g. its rows as a sub-batch of their own, pipelined with the
        rest), or None: the runner's forward."""
        ...

    def graph_rows(self, rows: ExternalRows) -> ExternalRows | None:
        """`rows` as rows a captured decode graph replays: the same attention, reading its
        inputs (tables, slots, lengths) from buffers at fixed addresses, refilled here with
        this step's; the same object for every step of `rows.num_rows` rows. None: the
        source's attention cannot be captured (the step runs without the full graph)."""
        ...

    def close(self) -> None:
        """Stop whatever the source runs beside the runner (worker threads)."""
        ...
