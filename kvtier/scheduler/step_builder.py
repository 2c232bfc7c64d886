"""One step's decisions as the scheduler collects them."""

from __future__ import annotations

from kvtier.core.items import PlanItem
from kvtier.core.plan import BlockCopy
from kvtier.core.request import Request
from kvtier.scheduler.prefill_budget import PrefillChunker


class StepBuilder:
    """Collects one step's decisions."""

    def __init__(self, budget: int, prefills: PrefillChunker):
        self.budget = budget
        self.prefills = prefills
        self.entries: list[tuple[Request, int, tuple[tuple[int, ...], ...], bool, int]] = []
        self.swap_out: list[BlockCopy] = []
        self.swap_in: list[BlockCopy] = []
        self.items: list[PlanItem] = []  # the memory system's own work (kvtier/core/items.py)
        self.preempted: list[Request] = []

    def add(self, req: Request, n: int, blocks: tuple[tuple[int, ...], ...], reset: bool,
            recompute: int = 0) -> None:
        """`recompute`: dropped-prefix tokens this request recomputes (they cost budget)."""
        self.entries.append((req, n, blocks, reset, recompute))
        self.budget -= n + recompute

    def unschedule(self, req: Request) -> int:
        """Takes back `req`'s entry (it was preempted after it was scheduled); the budget
        it had taken, which the caller gives back (0 if it had none)."""
        for k, (r, n, _, _, recompute) in enumerate(self.entries):
            if r is req:
                del self.entries[k]
                self.prefills.give_back(
                    n, r.num_tokens + r.num_pending_tokens - r.num_computed_tokens)
                return n + recompute
        return 0
