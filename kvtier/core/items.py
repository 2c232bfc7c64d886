"""Typed plan items: the work a memory system adds to a step beyond computing tokens (copies
of its own, restores, ...), and the registry that says who carries each kind out.

A memory system defines its item classes (subclasses of `PlanItem`) in its package and
registers, per kind, the runner hook that executes a step's items of that kind and the
cost-model price of them (`register_item`). A plan carries items only when a system made
some (`StepPlan.items`, empty otherwise), and the runner and the cost model dispatch once per
kind present, never per request. Torch-free: the simulator and the pricing model import it.

Contracts:
  * run(runner, items): called by the model runner once per step for that step's items of
    the kind, in plan order, after the rows of finished/preempted requests are forgotten and
    before any of the runner's own copies and the forward, on the compute stream. It may
    read and write the runner's pools (`runner.gpu_kv`, `runner.host_kv`), what its system
    attached to the runner, and the block-table row of a running request it re-placed
    (`runner.block_tables.apply_ids(..., reset=True)`), nothing else of the runner's
    state; the plan's block ids are valid for the whole step.
  * price(cost_model, count): seconds the step spends on `count` units of the kind
    (`PlanItem.count`: blocks, tokens, ...), added to the step's time as a serial part.
  * step(cost_model, shape) (optional): the whole step's StepCost, for a kind whose items
    change how the step runs (two overlapping sub-batches, rows left out); the cost model
    then prices the step through it alone (the first such kind present), and it prices the
    step's other items itself.
  * background(cost_model, count) (optional): seconds the kind's copies keep the copy
    stream busy after the step is issued, which the step itself does not wait for but the
    next step does (the runner joins the copy stream before a step reuses any block); the
    simulator carries them over (`CostModel.background_seconds`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar, cast

_Item = TypeVar("_Item", bound="PlanItem")


class PlanItem:
    """Base of plan items. `kind` names the item class in step shapes and records."""

    __slots__ = ()
    kind: ClassVar[str] = ""

    @property
    def count(self) -> int:
        """Units the cost model prices the item by (blocks, tokens); 1 by default."""
        return 1


@dataclass(frozen=True)
class ItemKind:
    item_cls: type[PlanItem]
    run: Callable[[Any, list[Any]], None]  # (model runner, items of the kind)
    price: Callable[[Any, int], float]  # (cost model, summed counts) -> seconds
    step: Callable[[Any, Any], Any] | None = None  # (cost model, StepShape) -> StepCost
    background: Callable[[Any, int], float] | None = None  # (cost model, counts) -> seconds


_KINDS: dict[type[PlanItem], ItemKind] = {}
_BY_NAME: dict[str, ItemKind] = {}


def register_item(item_cls: type[PlanItem], run: Callable[[Any, list[Any]], None],
                  price: Callable[[Any, int], float],
                  step: Callable[[Any, Any], Any] | None = None,
                  background: Callable[[Any, int], float] | None = None) -> None:
    if not item_cls.kind:
        raise ValueError(f"{item_cls.__name__} needs a `kind` name")
    kind = ItemKind(item_cls, run, price, step, background)
    _KINDS[item_cls] = kind
    _BY_NAME[item_cls.kind] = kind


def item_kind(item_cls: type[PlanItem]) -> ItemKind:
    try:
        return _KINDS[item_cls]
    except KeyError:
        raise KeyError(f"plan item {item_cls.__name__} has no registered hooks "
                       "(kvtier.core.items.register_item)") from None


def kind_named(name: str) -> ItemKind:
    return _BY_NAME[name]


def step_pricer(counts: Iterable[tuple[str, int]]) -> Callable[[Any, Any], Any] | None:
    """The `step` hook of the first kind in a shape's item counts that has one, else None."""
    for name, _ in counts:
        step = _BY_NAME[name].step
        if step is not None:
            return step
    return None


def by_kind(items: Iterable[PlanItem]) -> dict[type[PlanItem], list[PlanItem]]:
    """A step's items grouped by class, each group in plan order."""
    groups: dict[type[PlanItem], list[PlanItem]] = {}
    for item in items:
        groups.setdefault(type(item), []).append(item)
    return groups


def group_of(groups: Mapping[type[PlanItem], Sequence[PlanItem]],
             cls: type[_Item]) -> Sequence[_Item]:
    """The items of class `cls` in `by_kind`'s groups (none: empty)."""
    return cast("Sequence[_Item]", groups.get(cls, ()))


def item_counts(items: Iterable[PlanItem]) -> tuple[tuple[str, int], ...]:
    """(kind, summed count) per kind present, sorted by kind: what a StepShape keeps."""
    counts: dict[str, int] = {}
    for item in items:
        counts[item.kind] = counts.get(item.kind, 0) + item.count
    return tuple(sorted(counts.items()))
