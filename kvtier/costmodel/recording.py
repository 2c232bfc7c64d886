"""An executor wrapper that records every step: its shape, when it started and how long
`execute` took (wall clock). Around the real runner it yields the ground truth the cost
model is scored on; around the simulated one, the engine loop's own overhead."""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvtier.core.plan import StepPlan, StepResult
from kvtier.costmodel.shape import StepShape


@dataclass(frozen=True)
class StepRecord:
    start_s: float  # perf_counter at the call
    execute_s: float
    shape: StepShape

    def to_json(self) -> list:
        return [self.start_s, self.execute_s, self.shape.to_json()]

    @classmethod
    def from_json(cls, row: list) -> StepRecord:
        return cls(row[0], row[1], StepShape.from_json(row[2]))


class RecordingExecutor:
    def __init__(self, inner):
        self.inner = inner
        self.records: list[StepRecord] = []

    def execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        result = self.inner.execute(plan)
        self.records.append(StepRecord(t0, time.perf_counter() - t0, StepShape.from_plan(plan)))
        return result

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # the runner's attributes (num_groups, graphs, ...)


def loop_overheads(records: list[StepRecord]) -> list[tuple[StepShape, float]]:
    """(shape, seconds between the end of a step's execute and the start of the next)."""
    return [(a.shape, b.start_s - a.start_s - a.execute_s) for a, b in zip(records, records[1:])]
