"""An executor wrapper that records every step: its shape, when it started, how long
`execute` took (wall clock) and, where the executor launches steps without waiting for them
(the real runner), how long issuing the step took on the host. Around the real runner it
yields the ground truth the cost model is scored on; around the simulated one, the engine
loop's own overhead."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtier.core.plan import StepPlan, StepResult
from kvtier.costmodel.shape import StepShape


@dataclass(frozen=True)
class StepRecord:
    start_s: float  # perf_counter at the call
    execute_s: float
    shape: StepShape
    # Host seconds until `launch` returned: every kernel issued, nothing waited for. Close
    # to execute_s means the host, not the GPU, set the step's time. None: not measured.
    issue_s: float | None = None

    def to_json(self) -> list:
        row = [self.start_s, self.execute_s, self.shape.to_json()]
        return row if self.issue_s is None else [*row, self.issue_s]

    @classmethod
    def from_json(cls, row: list) -> StepRecord:
        return cls(row[0], row[1], StepShape.from_json(row[2]), row[3] if len(row) > 3 else None)


class RecordingExecutor:
    def __init__(self, inner, probe: Callable[[], Any] | None = None):
        """`probe`: called after each step (outside its timed span); what it returns is kept
        in `probes`, one per record (a fidelity trace reads the caching allocator's
        counters with it)."""
        self.inner = inner
        self.records: list[StepRecord] = []
        self.probe = probe
        self.probes: list[Any] = []

    def execute(self, plan: StepPlan) -> StepResult:
        t0 = time.perf_counter()
        launch = getattr(self.inner, "launch", None)
        if launch is None:
            result, issued = self.inner.execute(plan), None
        else:  # the runner's execute is launch(plan).result(): the same work, split in two
            pending = launch(plan)
            issued = time.perf_counter() - t0
            result = pending.result()
        self.records.append(StepRecord(t0, time.perf_counter() - t0, StepShape.from_plan(plan),
                                       issued))
        if self.probe is not None:
            self.probes.append(self.probe())
        return result

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # the runner's attributes (num_groups, graphs, ...)


def loop_overheads(records: list[StepRecord]) -> list[tuple[StepShape, float]]:
    """(shape, seconds between the end of a step's execute and the start of the next)."""
    return [(a.shape, b.start_s - a.start_s - a.execute_s) for a, b in zip(records, records[1:])]
