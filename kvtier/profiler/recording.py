"""An executor wrapper that records every step: its shape, when it started, how long until
its tokens were on the host (wall clock) and, where the executor launches steps without
waiting for them (the real runner), how long issuing the step took on the host. Around the real runner it
yields the ground truth the cost model is scored on; around the simulated one, the engine
loop's own overhead."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtier.core.executor import Executor, PendingResult, ReadyResult
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
    """An Executor around another that records every step it runs, whether the engine
    calls `execute` (synchronous) or `launch` (async scheduling: the record is made when the
    step's result is read, in launch order)."""

    def __init__(self, inner: Executor, probe: Callable[[], Any] | None = None):
        """`probe`: called after each step (outside its timed span); what it returns is kept
        in `probes`, one per record (a fidelity trace reads the caching allocator's
        counters with it)."""
        self.inner = inner
        self.records: list[StepRecord] = []
        self.probe = probe
        self.probes: list[Any] = []

    @property
    def async_by_default(self) -> bool:
        return self.inner.async_by_default

    @property
    def supports_async(self) -> bool:
        return self.inner.supports_async

    def execute(self, plan: StepPlan) -> StepResult:
        if self.inner.supports_async:  # the runner's execute is launch(plan).result()
            return self.launch(plan).result()
        t0 = time.perf_counter()
        result = self.inner.execute(plan)
        self._record(StepRecord(t0, time.perf_counter() - t0, StepShape.from_plan(plan)))
        return result

    def launch(self, plan: StepPlan) -> PendingResult:
        if not self.inner.supports_async:
            return ReadyResult(self.execute(plan))
        t0 = time.perf_counter()
        pending = self.inner.launch(plan)
        return _RecordedStep(self, plan, pending, t0, time.perf_counter() - t0)

    def close(self) -> None:
        self.inner.close()

    def _record(self, record: StepRecord) -> None:
        self.records.append(record)
        if self.probe is not None:
            self.probes.append(self.probe())


class _RecordedStep:
    """A launched step; reading its result (once) makes its record."""

    def __init__(self, owner: RecordingExecutor, plan: StepPlan, pending: PendingResult,
                 t0: float, issue_s: float):
        self.owner, self.plan, self.pending = owner, plan, pending
        self.t0, self.issue_s = t0, issue_s
        self._result: StepResult | None = None

    def result(self) -> StepResult:
        if self._result is None:
            self._result = self.pending.result()
            self.owner._record(StepRecord(self.t0, time.perf_counter() - self.t0,
                                          StepShape.from_plan(self.plan), self.issue_s))
        return self._result


def loop_overheads(records: list[StepRecord]) -> list[tuple[StepShape, float]]:
    """(shape, seconds between the end of a step's execute and the start of the next)."""
    return [(a.shape, b.start_s - a.start_s - a.execute_s) for a, b in zip(records, records[1:])]
