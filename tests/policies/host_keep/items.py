"""host_keep's plan items: a preempted request's blocks going to the host pool and coming
back, each executed by host_keep's own runner hook and priced by its own price."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.core.items import PlanItem
from kvtier.core.plan import BlockCopy


@dataclass(frozen=True, slots=True)
class KeepOut(PlanItem):
    kind = "host_keep_out"
    copies: tuple[BlockCopy, ...]  # device block -> host block

    @property
    def count(self) -> int:
        return len(self.copies)


@dataclass(frozen=True, slots=True)
class KeepIn(PlanItem):
    kind = "host_keep_in"
    copies: tuple[BlockCopy, ...]  # host block -> device block

    @property
    def count(self) -> int:
        return len(self.copies)


RUNS = {"out": 0, "in": 0}  # blocks the runner hooks moved (the test reads them)


def run_keep_out(runner, items: list[KeepOut]) -> None:
    for item in items:
        for c in item.copies:
            runner.host_kv[c.dst].copy_(runner.gpu_kv[c.src])
        RUNS["out"] += len(item.copies)


def run_keep_in(runner, items: list[KeepIn]) -> None:
    for item in items:
        for c in item.copies:
            runner.gpu_kv[c.dst].copy_(runner.host_kv[c.src])
        RUNS["in"] += len(item.copies)


def price_keep_out(cost_model, num_blocks: int) -> float:
    out, _ = cost_model.copy_costs()
    return out.seconds(num_blocks * cost_model.config.block_bytes)


def price_keep_in(cost_model, num_blocks: int) -> float:
    _, inn = cost_model.copy_costs()
    return inn.seconds(num_blocks * cost_model.config.block_bytes)
