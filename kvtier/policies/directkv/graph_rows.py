"""DirectKV's host rows inside a full-model decode graph (kvtier/runner/cuda_graphs.py).

A capture keeps every address a kernel was launched with, so a replay is valid only if
what the host rows' kernels read stays where it was: the pinned host pages do (allocated
once, kvtier/policies/host_resident/runner_side.py), and their tables, slots and lengths are
copied each step into the buffers here. The tables are kept at a request's full width: the
zero-copy kernel's split count follows the table's width (a host bound on every context,
kvtier/kernels/host_decode_attention.py), so every replay launches the captured grid.
"""

from __future__ import annotations

from typing import Any

import torch

from kvtier.policies.directkv.zero_copy_rows import RowInputs, ZeroCopyRows
from kvtier.policies.host_resident.runner_side import HostRowsLayout


class GraphRowInputs:
    """Buffers for up to max_num_seqs host rows, and one ZeroCopyRows per row count that
    views them (a graph of n host rows is captured with, and replays, that object)."""

    def __init__(self, runner: Any, pages: torch.Tensor):
        table = runner.block_tables.table  # [G, R, W] int32
        groups, width = table.shape[0], table.shape[2]
        m, dev = runner.config.scheduler.max_num_seqs, runner.device
        self.runner, self.pages = runner, pages
        self.tables = torch.zeros((groups, m, width), dtype=torch.int32, device=dev)
        self.slots = torch.zeros((groups, m), dtype=torch.int64, device=dev)
        self.lens = torch.ones(m, dtype=torch.int32, device=dev)
        self.rows: dict[int, ZeroCopyRows] = {}

    def fill(self, layout: HostRowsLayout) -> ZeroCopyRows:
        n, width = layout.num_rows, layout.tables.shape[2]
        put = self.runner.staging.put_into
        # Entries past a row's own width are never read: each program stops at its length.
        put(self.tables[:, :n, :width], layout.tables)
        put(self.slots[:, :n], layout.slots)
        put(self.lens[:n], layout.context_lens)
        rows = self.rows.get(n)
        if rows is None:
            r = self.runner
            # In line, not on the side stream: the hook's record_stream on q and k means
            # nothing inside a capture, and on the one shape measured the side stream hid
            # next to nothing (results/policies/host_resident_long_h200.json).
            inputs = RowInputs(self.tables[:, :n], self.slots[:, :n], self.lens[:n])
            rows = self.rows[n] = ZeroCopyRows(n, self.pages, r.layers_per_block, r.ops,
                                               r.device, inputs=inputs)
        return rows
