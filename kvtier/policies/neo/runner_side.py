"""NEO's runner side: a host row's attention runs on the CPU, beside the KV it reads. Per
layer the rows' q, k and v cross PCIe to the host (one copy), and one job on the CPU
kernel's own thread (not the Python main thread, which waits without the GIL) stores their
new K/V into the host pages and attends (kvtier/kernels/cpu_attention_layers.py); the
output crosses back."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from kvtier.attention.base import Rope
from kvtier.core.items import PlanItem, group_of
from kvtier.core.plan import ScheduledRequest
from kvtier.kernels.cpu_attention_layers import CpuLayerWorker, PendingLayer, StepLayers
from kvtier.policies.host_resident.items import HostRows
from kvtier.policies.host_resident.runner_side import (
    HostResidentSource,
    HostRowsAttention,
    HostRowsLayout,
)
from kvtier.policies.neo.graph_rows import CpuGraphRows, GraphSteps

logger = logging.getLogger("kvtier")


class CpuRows(HostRowsAttention):
    def __init__(self, layout: HostRowsLayout, pages: torch.Tensor, layers_per_block: int,
                 ops: Any, worker: CpuLayerWorker, num_threads: int | None, num_heads: int,
                 pinned: bool):
        super().__init__(layout.num_rows, pages, layers_per_block, ops, layout)
        assert layout.device is None, "NEO moves whole requests: no row has a device suffix"
        self.worker, self.num_heads, self.num_threads, self.pinned = (
            worker, num_heads, num_threads, pinned)
        self._calls: StepLayers | None = None

    @property
    def calls(self) -> StepLayers:
        """The layer calls (their pinned staging made at the first layer: a step replayed
        as a graph never makes them)."""
        if self._calls is None:
            layout = self.layout
            assert layout is not None
            self._calls = StepLayers(self.worker, self.pages, torch.from_numpy(layout.tables),
                                     torch.from_numpy(layout.slots),
                                     torch.from_numpy(layout.context_lens), self.num_heads,
                                     self.num_threads, self.pinned)
        return self._calls

    def layer(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        o, _ = self.calls.submit(group, slot, q, k, v, scale).result()
        out.copy_(o, non_blocking=True)  # from the staging buffer, which the next layer reuses
        # only after its own copy to the host, later in the stream

    def drain(self) -> None:
        """Wait for a layer still on the CPU (a step that failed meanwhile)."""
        if self._calls is not None:
            self._calls.drain()

    def submit(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float, rope: Rope | None) -> PendingLayer:
        """Layer `layer_idx`'s attention for q/k/v of exactly these rows, on the CPU
        kernel's thread; returns at once (the pipelined forward runs the other rows
        meanwhile)."""
        if rope is not None:
            q, k = self.ops.rotary(q, k, rope.positions, rope.cos_sin_cache)
        group, slot = divmod(layer_idx, self.layers_per_block)
        return self.calls.submit(group, slot, q, k, v, scale)


class NeoSource(HostResidentSource):
    def __init__(self, runner: Any, rows_item: type[HostRows], num_threads: int | None,
                 graphs: bool = True, flagged_pipeline: bool = False):
        super().__init__(runner, rows_item)
        self.worker = CpuLayerWorker()  # builds (or finds cached) the kernel at start-up
        self.num_threads = num_threads
        self._pipelined: CpuRows | None = None  # this step's rows, when it runs pipelined
        self.graphs = graphs and GraphSteps.available(runner, self.worker)
        self.flagged_pipeline = flagged_pipeline and self.graphs
        if flagged_pipeline and not self.graphs:
            logger.info("neo: --neo-flagged-pipeline needs the graph steps (a GPU and the "
                        "native step job); pipelined steps hand each layer over instead")
        self._graph_steps: GraphSteps | None = None  # on the first graph step

    def for_step(self, scheduled: Sequence[ScheduledRequest], batch: Any,
                 items: Mapping[type[PlanItem], Sequence[PlanItem]]) -> HostRowsAttention | None:
        rows = super().for_step(scheduled, batch, items)
        self._pipelined = None
        if isinstance(rows, CpuRows) and getattr(group_of(items, self.rows_item)[0],
                                                 "pipelined", False):
            self._pipelined = rows
        return rows

    def attention(self, layout: HostRowsLayout) -> CpuRows:
        r = self.runner
        return CpuRows(layout, self.pages, r.layers_per_block, r.ops, self.worker,
                       self.num_threads, r.model_config.num_heads, r.device.type == "cuda")

    def run_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    meta: Any) -> torch.Tensor | None:
        """The pipelined forward when the plan chose it for this step (neo/pipeline.py):
        batch 1's layers handed over one at a time, or through the step job's flags under
        --neo-flagged-pipeline (slower on the H200, where these eager steps are bound by
        their launches: results/policies/host_resident_neo_flags_h200_6709e73.json)."""
        rows, self._pipelined = self._pipelined, None
        if rows is None:
            return None
        from kvtier.policies.neo.pipelined import pipelined_forward

        assert rows.layout is not None, "a step's CpuRows come with its layout"
        flag_rows = self.steps.rows_for(rows.layout) if self.flagged_pipeline else None
        return pipelined_forward(self.runner, rows, input_ids, positions, meta, flag_rows)

    @property
    def steps(self) -> GraphSteps:
        """The hand-over buffers and the step job (made at the first step that needs them)."""
        if self._graph_steps is None:
            self._graph_steps = GraphSteps(self.runner, self.pages, self.worker,
                                           self.num_threads)
        return self._graph_steps

    def graph_rows(self, rows: Any) -> CpuGraphRows | None:
        """A sequential step's rows as a decode graph's (graph_rows.py); None for a
        pipelined step, under `--no-neo-graphs`, or where the kernel is not built."""
        if not self.graphs or not isinstance(rows, CpuRows) or rows is self._pipelined:
            return None
        assert rows.layout is not None, "a step's CpuRows come with its layout"
        return self.steps.rows_for(rows.layout)

    def close(self) -> None:
        self.worker.close()
