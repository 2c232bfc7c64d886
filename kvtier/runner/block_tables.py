"""The runner's persistent block tables, kept in sync with the scheduler through plan diffs.

One row per running request; rows are reused. The numpy table serves the host (slot
mapping); a device mirror receives only each step's new entries (a few hundred ints, not
the whole [groups, requests, blocks] table), and kernels read rows of it gathered on the
device.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from kvtier.core.plan import ScheduledRequest


class BlockTables:
    def __init__(self, num_groups: int, max_reqs: int, max_blocks_per_req: int,
                 device: torch.device | None = None):
        self.table = np.zeros((num_groups, max_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_reqs, dtype=np.int32)
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(max_reqs - 1, -1, -1))
        self.device_table: torch.Tensor | None = None
        if device is not None:
            self.device_table = torch.zeros(self.table.shape, dtype=torch.int32, device=device)
        self._dirty: list[tuple[int, int, int]] = []  # (row, first column, count)

    def apply(self, sr: ScheduledRequest) -> int:
        """Record the request's new blocks; returns its row."""
        return self.apply_ids(sr.request_id, sr.new_block_ids, sr.reset_blocks)

    def apply_all(self, scheduled: list[ScheduledRequest]) -> list[int]:
        """`apply` for a whole step; the rows in order. Most decode steps add no block to
        most requests (one dict lookup each here) and one block to a few: those are written
        with one numpy assignment, not two numpy calls per request."""
        row_of, apply_ids = self.row_of, self.apply_ids
        rows: list[int] = []
        one_rows: list[int] = []  # rows that get exactly one new block per group
        one_ids: list[tuple[tuple[int, ...], ...]] = []
        for sr in scheduled:
            new_ids = sr.new_block_ids
            row = row_of.get(sr.request_id)
            if row is not None and not sr.reset_blocks:
                if not new_ids or not new_ids[0]:
                    rows.append(row)
                    continue
                if len(new_ids[0]) == 1:
                    one_rows.append(row)
                    one_ids.append(new_ids)
                    rows.append(row)
                    continue
            rows.append(apply_ids(sr.request_id, new_ids, sr.reset_blocks))
        if one_rows:
            r = np.asarray(one_rows)
            cols = self.num_blocks[r]
            self.table[:, r, cols] = np.asarray(one_ids, dtype=np.int32)[:, :, 0].T  # [G, N]
            self.num_blocks[r] = cols + 1
            self._dirty += zip(one_rows, cols.tolist(), [1] * len(one_rows))
        return rows

    def apply_ids(self, request_id: str, new_ids: tuple[tuple[int, ...], ...], reset: bool) -> int:
        """New block ids per group (the whole row again if `reset`); returns the row."""
        row = self.row_of.get(request_id)
        if row is None:
            if not self._free_rows:
                raise RuntimeError("more running requests than block-table rows")
            row = self._free_rows.pop()
            self.row_of[request_id] = row
        start = 0 if reset else int(self.num_blocks[row])
        k = len(new_ids[0]) if new_ids else 0
        if k:
            self.table[:, row, start : start + k] = np.asarray(new_ids, dtype=np.int32)
            self._dirty.append((row, start, k))
        self.num_blocks[row] = start + k
        return row

    def point_prefix(self, row: int, blocks: range, group: int | None = None) -> None:
        """Point a row's first len(blocks) columns (a dropped prefix) at `blocks`, in every
        layer group or in `group` only (dropped prefixes' recompute scratch; those columns are read
        nowhere else)."""
        k = len(blocks)
        where = slice(None) if group is None else group
        self.table[where, row, :k] = np.arange(blocks.start, blocks.stop, dtype=np.int32)
        self._dirty.append((row, 0, k))

    def sync_device(self, upload: Callable[[np.ndarray], torch.Tensor]) -> None:
        """Copy this step's new entries to the device mirror: one small upload, one scatter.
        `upload` puts a host array on the device (the runner's pinned staging)."""
        if self.device_table is None or not self._dirty:
            self._dirty.clear()
            return
        # Every (row, column) of the dirty runs, without a numpy call per run.
        dirty = np.asarray(self._dirty, dtype=np.int64)  # [N, 3]: row, first column, count
        counts = dirty[:, 2]
        rows = np.repeat(dirty[:, 0], counts)
        run_start = np.cumsum(counts) - counts  # where each run begins in rows/cols
        cols = np.arange(len(rows)) + np.repeat(dirty[:, 1] - run_start, counts)
        values = self.table[:, rows, cols]  # [G, N]
        packed = upload(np.stack([rows, cols]).astype(np.int64))
        vals = upload(values)
        self.device_table[:, packed[0], packed[1]] = vals
        self._dirty.clear()

    def gather_device(self, rows: torch.Tensor, width: int | None = None) -> torch.Tensor:
        """[G, len(rows), width] view of the device mirror's rows (row-contiguous)."""
        assert self.device_table is not None
        return self.device_table.index_select(1, rows)[:, :, :width]

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.num_blocks[row] = 0
            self._free_rows.append(row)
