"""An executor that checks the plan protocol without tensors.

It mirrors the runner's persistent block tables from plan diffs and keeps, for every
physical block, a tag of what it should contain: (request, group, token block, #tokens).
Computing tokens at `start_pos` requires every earlier token's tag to be where the table
says — so a dropped, stale or wrongly swapped block is caught.
"""

from __future__ import annotations

from kvtier.core.plan import HiddenRestore, RecomputePrefix, StepPlan, StepResult, items_of
from kvtier.runner.block_tables import BlockTables


class FakeExecutor:
    def __init__(self, num_groups: int, block_size: int, max_reqs: int, max_blocks: int,
                 vocab: int = 1000):
        self.tables = BlockTables(num_groups, max_reqs, max_blocks)
        self.num_groups, self.block_size, self.vocab = num_groups, block_size, vocab
        self.device: dict[int, tuple] = {}
        self.host: dict[int, tuple] = {}
        self.steps = 0

    def execute(self, plan: StepPlan) -> StepResult:
        self.steps += 1
        for rid in (*plan.finished_ids, *plan.preempted_ids):
            self.tables.remove(rid)
        for c in plan.swap_out:
            self.host[c.dst] = self.device.pop(c.src)
        for c in plan.swap_in:
            self.device[c.dst] = self.host.pop(c.src)
        rows = [self.tables.apply(sr) for sr in plan.scheduled]
        for r in items_of(plan, HiddenRestore):  # KV re-projected from hidden states
            self._write(r.request_id, self.tables.row_of[r.request_id], 0, r.num_tokens)
        sampled = {}
        prefix_len = {p.request_id: len(p.token_ids) for p in items_of(plan, RecomputePrefix)}
        for sr, row in zip(plan.scheduled, rows):
            dropped = prefix_len.get(sr.request_id, 0)  # recomputed this step, not read
            self._check_and_write(sr.request_id, row, sr.start_pos, sr.seq_len, dropped)
            if sr.sample:
                sampled[sr.request_id] = self.token_for(sr.request_id, sr.seq_len)
        return StepResult(sampled=sampled)

    def token_for(self, request_id: str, position: int) -> int:
        return (hash((request_id, position)) % (self.vocab - 10)) + 10  # never an eos (< 10)

    def _write(self, rid: str, row: int, start: int, end: int) -> None:
        bs = self.block_size
        for g in range(self.num_groups):
            for j in range(start // bs, -(-end // bs)):
                self.device[int(self.tables.table[g, row, j])] = (rid, g, j, min(bs, end - j * bs))

    def _check_and_write(self, rid: str, row: int, start: int, end: int, dropped: int = 0) -> None:
        bs = self.block_size
        assert self.tables.num_blocks[row] * bs >= end, f"{rid}: table too short for {end}"
        for g in range(self.num_groups):
            for j in range(dropped // bs, -(-end // bs)):
                block = int(self.tables.table[g, row, j])
                filled_before = max(0, min(bs, start - j * bs))
                if filled_before:
                    tag = self.device.get(block)
                    assert tag is not None and tag[:3] == (rid, g, j) and tag[3] >= filled_before, (
                        f"{rid}: block {block} (group {g}, token block {j}) holds {tag}")
                self.device[block] = (rid, g, j, min(bs, end - j * bs))
