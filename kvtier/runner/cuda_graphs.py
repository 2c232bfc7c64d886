"""CUDA graphs for decode-only steps, so a step's ~200 kernel launches cost one replay.

Captured once per padded batch size, from the largest down, sharing one memory pool. Inputs
live in static buffers; a step writes its first b rows, and the padded rows point at a
scratch block (the pool's last block, which the KV manager never hands out), so their
KV writes and reads touch nothing real. Attention grids depend only on (batch, heads,
splits): the split count is fixed from max_model_len and each program skips what lies past
its request's length, so the graphs stay valid as sequences grow. The order the attention
launches its rows in (longest context first) is one more static input, the padded rows last.

Steps whose leading rows a memory system attends for (external rows, whose source hands
over rows a graph can replay: kvtier/runner/external_rows.py) get graphs of their own, one
per (padded size, external rows), captured at the first step of that shape with its real
inputs: every kernel of a decode step writes what it would write again, so the warm-up run
before the capture and the replay after it leave the pools as one run would.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from kvtier.attention.base import ExternalRows
from kvtier.attention.metadata import AttentionMetadata
from kvtier.model.llama import ForwardContext
from kvtier.runner.capture_guard import collector_paused
from kvtier.runner.graph_host import GraphHost
from kvtier.runner.host_batch import HostBatch

# Graphs with external rows are captured during serving, one per shape met: a bound keeps a
# run whose host-row counts wander from capturing (and holding) a graph at every step; the
# shapes past it run the piecewise forward.
MAX_EXTERNAL_GRAPHS = 64


class DecodeGraphs:
    def __init__(self, runner: GraphHost, scratch_block: int):
        # A weak reference: the runner owns the graphs, so a strong one would be a cycle that
        # keeps a dead engine's GPU memory alive until the garbage collector runs.
        self.runner: GraphHost = weakref.proxy(runner)
        dev = runner.device
        self.sizes = runner.graph_sizes
        m = self.sizes[-1]
        g, max_blocks = runner.num_groups, runner.block_tables.table.shape[2]
        self.scratch_slot = scratch_block * runner.block_size
        self.scratch_block = scratch_block
        self.input_ids = torch.zeros(m, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(m, dtype=torch.int64, device=dev)
        self.query_start_loc = torch.arange(m + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(m, dtype=torch.int32, device=dev)
        self.decode_order = torch.arange(m, dtype=torch.int32, device=dev)
        self.block_tables = torch.full((g, m, max_blocks), scratch_block, dtype=torch.int32,
                                       device=dev)
        self.slot_mapping = torch.full((g, m), self.scratch_slot, dtype=torch.int64, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        # (padded size, external rows) -> graph; and its replays (the tests count them)
        self.external_graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.num_external_replays = 0
        # One logits buffer for every graph: an output each would keep its own, and at 1,024
        # rows of Llama 3's 128k vocabulary the ~70 sizes' outputs held 9 GB.
        self.logits = torch.empty(m, runner.model_config.vocab_size, dtype=runner.dtype,
                                  device=dev)
        self.pool: Any = None  # the graphs share one memory pool

    def _meta(self, b: int, external: ExternalRows | None = None) -> AttentionMetadata:
        r = self.runner
        max_len = r.config.scheduler.max_model_len
        meta = AttentionMetadata(
            num_tokens=b, num_reqs=b, num_decodes=b, max_query_len=1, max_seq_len=max_len,
            query_start_loc=self.query_start_loc[: b + 1], seq_lens=self.seq_lens[:b],
            block_tables=self.block_tables[:, :b], slot_mapping=self.slot_mapping[:, :b],
            layers_per_block=r.layers_per_block, block_size=r.block_size,
            query_lens_cpu=[1] * b, seq_lens_cpu=[max_len] * b,
            decode_order=self.decode_order[:b],
        )
        meta.external = external
        return meta

    def _forward(self, b: int, external: ExternalRows | None = None) -> torch.Tensor:
        r = self.runner
        assert r.gpu_kv is not None
        ctx = ForwardContext(r.ops, r.attention, r.gpu_kv, self._meta(b, external), r.cos_sin)
        hidden = r.model(self.input_ids[:b], self.positions[:b], ctx)
        return r.model.compute_logits(hidden, out=self.logits[:b])

    @torch.inference_mode()
    def capture(self) -> None:
        with collector_paused():  # no destructor of dead CUDA objects inside a capture
            for b in reversed(self.sizes):
                self.graphs[b] = self._capture(b)
            torch.cuda.synchronize()

    def _capture(self, b: int, external: ExternalRows | None = None) -> torch.cuda.CUDAGraph:
        self._forward(b, external)  # warm-up: Triton compiles and autotunes outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        # thread_local: a capture during serving must not fail for another thread's CUDA call
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            self._forward(b, external)
        if self.pool is None:
            self.pool = graph.pool()
        return graph

    @torch.inference_mode()
    def _external_graph(self, size: int, external: ExternalRows) -> torch.cuda.CUDAGraph:
        """The graph of `size` rows whose leading ones `external` attends for, captured now
        with the step's inputs (already in the static buffers) if it is new."""
        key = (size, external.num_rows)
        graph = self.external_graphs.get(key)
        if graph is None:
            with collector_paused():
                graph = self.external_graphs[key] = self._capture(size, external)
        return graph

    def padded_size(self, b: int) -> int | None:
        for s in self.sizes:
            if s >= b:
                return s
        return None

    def run(self, batch: HostBatch, fill_inputs: Callable[[torch.Tensor], None] | None = None,
            external: ExternalRows | None = None) -> torch.Tensor | None:
        """Logits [b, vocab] of a decode-only batch, or None if no graph fits it.
        `fill_inputs(input_ids)` edits the static input ids on the device before the replay
        (async scheduling's in-flight tokens). `external`: the step's leading rows, as the
        source's graph rows (their inputs in its own static buffers)."""
        b = batch.num_reqs
        size = self.padded_size(b)
        if size is None or (external is not None and self._past_bound(size, external)):
            return None
        staging = self.runner.staging
        put = staging.put_into
        rows = staging.put(batch.rows)
        put(self.input_ids[:b], batch.input_ids)
        if fill_inputs is not None:
            fill_inputs(self.input_ids[:b])
        put(self.positions[:b], batch.positions)
        put(self.seq_lens[:b], batch.seq_lens.astype(np.int32))
        # Padded rows (one token each) launch last, after the step's real rows.
        order = np.arange(size, dtype=np.int32)
        order[:b] = batch.decode_order
        put(self.decode_order[:size], order)
        put(self.slot_mapping[:, :b], batch.slots)
        self.block_tables[:, :b].copy_(self.runner.block_tables.gather_device(rows))
        if size > b:  # padded rows: one token over the scratch block
            self.seq_lens[b:size].fill_(1)
            self.slot_mapping[:, b:size].fill_(self.scratch_slot)
            self.block_tables[:, b:size, 0].fill_(self.scratch_block)
        if external is None:
            self.graphs[size].replay()
        else:
            self._replay_external(size, external)
        return self.logits[:b]

    def _replay_external(self, size: int, external: ExternalRows) -> None:
        external.begin()
        failed = True
        try:
            self._external_graph(size, external).replay()
            failed = False
        finally:
            external.end(failed)
        self.num_external_replays += 1

    def _past_bound(self, size: int, external: ExternalRows) -> bool:
        return ((size, external.num_rows) not in self.external_graphs
                and len(self.external_graphs) >= MAX_EXTERNAL_GRAPHS)
