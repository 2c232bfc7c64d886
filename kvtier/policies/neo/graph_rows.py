"""NEO's host rows inside a full-model decode graph (kvtier/runner/cuda_graphs.py).

A sequential step with CPU decodes otherwise runs the piecewise forward, and per layer the
Python main thread waits for the GPU, copies the rows' q/k/v down, hands the CPU its job,
waits again and copies the output up: the GPU idles through all of it. Here the step
replays one graph instead. Before the replay one job for the whole step starts on the CPU
kernel's thread (kvtier/kernels/cpu_attention_step.py); inside it, per layer, a kernel
writes the rows' q/k/v into pinned memory and raises the layer's ready flag, the device
rows' attention runs meanwhile, and a kernel waits for the CPU's done flag and reads the
output back (kvtier/kernels/host_handoff.py). What the graph's kernels read stays where it
was: the pinned hand-over buffers and flags are allocated once, and the step's epoch is a
device scalar refilled before each replay. The job reads the step's tables, slots and
lengths from host memory, so nothing of the layout is captured.
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch

from kvtier.kernels.cpu_attention_layers import CpuLayerWorker, default_num_threads
from kvtier.kernels.cpu_attention_step import Handoff, StepJob, native_steps, submit_step
from kvtier.kernels.host_handoff import rows_from_host, rows_to_host
from kvtier.policies.host_resident.runner_side import HostRowsAttention, HostRowsLayout

# Guards against a side that never answers (a bug, not a slow step): the CPU waits this long
# for a layer's rows, the GPU longer for its output.
CPU_WAIT_S = 60.0
GPU_WAIT_S = 120.0


class GraphSteps:
    """The hand-over buffers of one runner, and the job of the step being replayed."""

    def __init__(self, runner: Any, pages: torch.Tensor, worker: CpuLayerWorker,
                 num_threads: int | None):
        cfg, dev = runner.model_config, runner.device
        self.runner, self.pages, self.worker = runner, pages, worker
        self.scale = float(runner.model.layers[0].attn.scale)
        self.num_threads = default_num_threads() if num_threads is None else num_threads
        self.handoff = Handoff(cfg.num_layers, runner.config.scheduler.max_num_seqs,
                               cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, pages.dtype,
                               pinned=True)
        self.epoch = torch.zeros(1, dtype=torch.int32, device=dev)
        self.counters = torch.zeros(cfg.num_layers, dtype=torch.int32, device=dev)
        self.rows: dict[int, CpuGraphRows] = {}
        self.layout: HostRowsLayout | None = None  # the next replay's
        self.job: StepJob | None = None

    @staticmethod
    def available(runner: Any, worker: CpuLayerWorker) -> bool:
        return runner.device.type == "cuda" and native_steps(worker,
                                                             runner.model_config.head_dim)

    def rows_for(self, layout: HostRowsLayout) -> CpuGraphRows:
        """The graph rows of `layout.num_rows` rows, to replay with `layout`."""
        n = layout.num_rows
        self.layout = layout
        if n not in self.rows:
            r = self.runner
            # A proxy: rows held here that held this back would be a cycle, keeping a closed
            # runner's pinned host pool (the pages) until the collector ran.
            self.rows[n] = CpuGraphRows(n, self.pages, r.layers_per_block, r.ops,
                                        weakref.proxy(self))
        return self.rows[n]

    def begin(self) -> None:
        """The step's job, started before its graph runs; the epoch on the device."""
        layout, h = self.layout, self.handoff
        assert layout is not None and self.job is None, "one replay at a time"
        if int(h.error[0]):
            h.error.zero_()
            raise RuntimeError(f"a GPU wait for the CPU attention passed {GPU_WAIT_S} s")
        epoch = h.next_epoch()
        self.runner.staging.put_into(self.epoch, np.array([epoch], dtype=np.int32))
        self.job = submit_step(
            self.worker, h, self.pages, self.runner.layers_per_block,
            torch.from_numpy(layout.tables), torch.from_numpy(layout.slots),
            torch.from_numpy(layout.context_lens), self.scale, self.num_threads, epoch,
            CPU_WAIT_S)

    def end(self, failed: bool) -> None:
        """Waits for the step's job (it ends with the last layer); raises its error. A
        replay that failed to start cancels it."""
        job, self.job, self.layout = self.job, None, None
        if job is None:
            return
        if not failed:
            job.wait()
            return
        self.handoff.cancel(self.handoff.epoch)
        try:
            job.wait()
        except Exception:  # noqa: BLE001 - the cancel's (or a layer's) error: the replay's
            pass  # is the one that propagates


class CpuGraphRows(HostRowsAttention):
    """n host rows as a decode graph runs them (one object per n, captured and replayed)."""

    def __init__(self, num_rows: int, pages: torch.Tensor, layers_per_block: int, ops: Any,
                 steps: GraphSteps):
        super().__init__(num_rows, pages, layers_per_block, ops)
        self.steps = steps
        self._out: torch.Tensor | None = None  # the layer in flight's output rows

    def layer(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        s, n = self.steps, self.num_rows
        if scale != s.scale:
            raise RuntimeError(f"the CPU job attends at scale {s.scale}, the layer at {scale}")
        layer = group * self.layers_per_block + slot
        h = s.handoff
        rows_to_host(q, k, v, h.qkv[layer, :n], h.flags[0, layer:layer + 1],
                     s.counters[layer:layer + 1], s.epoch)
        self._out = out

    def join(self, layer_idx: int) -> None:
        assert self._out is not None, "join follows the layer's forward"
        h, n = self.steps.handoff, self.num_rows
        rows_from_host(h.out[layer_idx, :n], self._out, h.flags[1, layer_idx:layer_idx + 1],
                       self.steps.epoch, h.error, GPU_WAIT_S)
        self._out = None

    def begin(self) -> None:
        self.steps.begin()

    def end(self, failed: bool) -> None:
        self.steps.end(failed)
