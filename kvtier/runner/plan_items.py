"""The runner's dispatch of a plan's items to the hooks their memory systems registered
(kvtier/core/items.py has the contract): once per kind present, in plan order."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.core.items import PlanItem, by_kind, item_kind

if TYPE_CHECKING:
    from kvtier.runner.model_runner import ModelRunner


def run_items(runner: ModelRunner, items: list[PlanItem]) -> None:
    runner.copies.join_previous()  # the hooks may touch blocks the last copies wrote
    for cls, group in by_kind(items).items():
        item_kind(cls).run(runner, group)
