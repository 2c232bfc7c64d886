"""The runner's persistent block tables, kept in sync with the scheduler through plan diffs.

One row per running request; rows are reused. Building per-step tensors is then a numpy
fancy-index over rows instead of rebuilding Python lists of every table every step.
"""

from __future__ import annotations

import numpy as np

from kvtier.core.plan import ScheduledRequest


class BlockTables:
    def __init__(self, num_groups: int, max_reqs: int, max_blocks_per_req: int):
        self.table = np.zeros((num_groups, max_reqs, max_blocks_per_req), dtype=np.int32)
        self.num_blocks = np.zeros(max_reqs, dtype=np.int32)
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(max_reqs - 1, -1, -1))

    def apply(self, sr: ScheduledRequest) -> int:
        """Record the request's new blocks; returns its row."""
        row = self.row_of.get(sr.request_id)
        if row is None:
            if not self._free_rows:
                raise RuntimeError("more running requests than block-table rows")
            row = self._free_rows.pop()
            self.row_of[sr.request_id] = row
        start = 0 if sr.reset_blocks else int(self.num_blocks[row])
        k = len(sr.new_block_ids[0]) if sr.new_block_ids else 0
        if k:
            self.table[:, row, start : start + k] = np.asarray(sr.new_block_ids, dtype=np.int32)
        self.num_blocks[row] = start + k
        return row

    def remove(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.num_blocks[row] = 0
            self._free_rows.append(row)
