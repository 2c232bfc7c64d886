"""RecordingExecutor: what a fidelity trace keeps of each step."""

from __future__ import annotations

import time

from kvtier.core.plan import StepPlan, StepResult
from kvtier.costmodel.shape import StepShape
from kvtier.profiler.recording import RecordingExecutor, StepRecord


class _Pending:
    def __init__(self, wait_s: float):
        self.wait_s = wait_s

    def result(self) -> StepResult:
        time.sleep(self.wait_s)  # the GPU finishing after the host issued everything
        return StepResult(sampled={})


class _Runner:
    """Issues for 10 ms, then the step's tokens take 30 ms more."""

    def launch(self, plan: StepPlan) -> _Pending:
        time.sleep(0.01)
        return _Pending(0.03)


class _Sim:
    def execute(self, plan: StepPlan) -> StepResult:
        return StepResult(sampled={})


def test_a_launching_executor_records_its_issue_time_and_the_probe_after_the_step():
    probes = iter(range(10))
    rec = RecordingExecutor(_Runner(), probe=lambda: next(probes))
    rec.execute(StepPlan(scheduled=[]))
    rec.execute(StepPlan(scheduled=[]))
    first = rec.records[0]
    assert 0.01 <= first.issue_s < first.execute_s and first.execute_s >= 0.04
    assert rec.probes == [0, 1]
    again = StepRecord.from_json(first.to_json())
    assert again.issue_s == first.issue_s and again.execute_s == first.execute_s


def test_an_executor_without_launch_has_no_issue_time_and_old_rows_still_load():
    rec = RecordingExecutor(_Sim())
    rec.execute(StepPlan(scheduled=[]))
    assert rec.records[0].issue_s is None and len(rec.records[0].to_json()) == 3
    old_row = [1.0, 0.02, StepShape(4, 400, 100, (), 4).to_json()]
    assert StepRecord.from_json(old_row).issue_s is None
