"""DirectKV's host rows inside a full-model decode graph (kvtier/runner/cuda_graphs.py).

A capture keeps every address a kernel was launched with, so a replay is valid only if
what the host rows' kernels read stays where it was: the pinned host pages do (allocated
once, kvtier/policies/host_resident/runner_side.py), and their tables, slots and lengths are
copied each step into the buffers here. The tables are kept at a request's full width: the
zero-copy kernel's split count follows the table's width (a host bound on every context,
kvtier/kernels/host_decode_attention.py), so every replay launches the captured grid.
Under partial moves every graph also attends over the rows' device suffixes (a row without
one has length 0 there), so one graph serves steps with and without them.
"""

from __future__ import annotations

from typing import Any

import torch

from kvtier.policies.directkv.zero_copy_rows import RowInputs, SuffixInputs, ZeroCopyRows
from kvtier.policies.host_resident.runner_side import HostRowsLayout


class _Buffers:
    """Tables, slots and lengths for up to max_num_seqs rows."""

    def __init__(self, groups: int, rows: int, width: int, device: torch.device):
        self.tables = torch.zeros((groups, rows, width), dtype=torch.int32, device=device)
        self.slots = torch.full((groups, rows), -1, dtype=torch.int64, device=device)
        self.lens = torch.zeros(rows, dtype=torch.int32, device=device)

    def fill(self, put: Any, n: int, tables: Any, slots: Any, lens: Any) -> None:
        # Entries past a row's own width are never read: each program stops at its length.
        put(self.tables[:, :n, :tables.shape[2]], tables)
        put(self.slots[:, :n], slots)
        put(self.lens[:n], lens)

    def clear(self, n: int) -> None:
        self.slots[:, :n].fill_(-1)
        self.lens[:n].zero_()


class GraphRowInputs:
    """Buffers for up to max_num_seqs host rows (and their device suffixes, under partial
    moves), and one ZeroCopyRows per row count that views them (a graph of n host rows is
    captured with, and replays, that object)."""

    def __init__(self, runner: Any, pages: torch.Tensor, suffixes: bool):
        table = runner.block_tables.table  # [G, R, W] int32
        groups, width = table.shape[0], table.shape[2]
        m, dev = runner.config.scheduler.max_num_seqs, runner.device
        self.runner, self.pages = runner, pages
        self.host = _Buffers(groups, m, width, dev)
        self.host.lens.fill_(1)
        self.suffix = _Buffers(groups, m, width, dev) if suffixes else None
        self.rows: dict[int, ZeroCopyRows] = {}

    def fill(self, layout: HostRowsLayout) -> ZeroCopyRows:
        n, put = layout.num_rows, self.runner.staging.put_into
        self.host.fill(put, n, layout.tables, layout.slots, layout.context_lens)
        d = layout.device
        if self.suffix is not None:
            if d is not None:
                self.suffix.fill(put, n, d.tables, d.slots, d.lens)
            else:
                self.suffix.clear(n)
        else:
            assert d is None, "device suffixes without partial moves"
        rows = self.rows.get(n)
        if rows is None:
            r, s = self.runner, self.suffix
            suffix = (SuffixInputs(s.tables[:, :n], s.slots[:, :n], s.lens[:n])
                      if s is not None else None)
            # In line, not on the side stream: the hook's record_stream on q and k means
            # nothing inside a capture, and on the one shape measured the side stream hid
            # next to nothing (results/policies/host_resident_long_h200.json).
            h = self.host
            inputs = RowInputs(h.tables[:, :n], h.slots[:, :n], h.lens[:n], suffix)
            rows = self.rows[n] = ZeroCopyRows(n, self.pages, r.layers_per_block, r.ops,
                                               r.device, inputs=inputs, device_kv=r.gpu_kv)
        return rows
