"""The runner's dispatch of a plan's items to the hooks their memory systems registered
(kvtier/core/items.py has the contract): once per kind present, in plan order; the
shared placement mechanisms' items are the runner's own."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.core.items import PlanItem, item_kind
from kvtier.core.plan import HiddenBlocks, HiddenRestore, RecomputePrefix

if TYPE_CHECKING:
    from kvtier.runner.model_runner import ModelRunner


# Items of the shared placement mechanisms: the runner builds its batch from them itself.
RUNNER_OWNED = frozenset({RecomputePrefix, HiddenBlocks, HiddenRestore})


def run_items(runner: ModelRunner, items: dict[type[PlanItem], list[PlanItem]]) -> None:
    """`items`: the plan's items by class (`kvtier.core.items.by_kind`)."""
    joined = False
    for cls, group in items.items():
        if cls in RUNNER_OWNED:
            continue
        if not joined:  # the hooks may touch blocks the last step's copies wrote
            runner.copies.join_previous()
            joined = True
        item_kind(cls).run(runner, group)
