"""RecordingExecutor: what a fidelity trace keeps of each step."""

from __future__ import annotations

import time
from dataclasses import replace

from kvtier.core.executor import SyncExecutor
from kvtier.core.plan import StepPlan, StepResult
from kvtier.costmodel.shape import StepShape
from kvtier.profiler.recording import RecordingExecutor, StepRecord


class _Pending:
    def __init__(self, wait_s: float):
        self.wait_s = wait_s

    def result(self) -> StepResult:
        time.sleep(self.wait_s)  # the GPU finishing after the host issued everything
        return StepResult(sampled={})


class _Runner(SyncExecutor):
    """Issues for 10 ms, then the step's tokens take 30 ms more."""

    supports_async = True

    def launch(self, plan: StepPlan) -> _Pending:
        time.sleep(0.01)
        return _Pending(0.03)


class _Sim(SyncExecutor):
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


class _Counting(SyncExecutor):
    """Runs on the CPU through both paths, counting each, so the test sees which one ran."""

    supports_async = True

    def __init__(self, inner):
        self.inner, self.launched, self.executed = inner, 0, 0

    def execute(self, plan: StepPlan) -> StepResult:
        self.executed += 1
        return self.inner.execute(plan)

    def launch(self, plan: StepPlan) -> _Ready:
        self.launched += 1
        return _Ready(self.inner.execute(plan))


class _Ready:
    def __init__(self, result: StepResult):
        self._result = result

    def result(self) -> StepResult:
        return self._result


def test_the_recorder_records_every_step_of_an_async_engine():
    """The engine launches (async scheduling), never executes: every step is recorded all
    the same (the fidelity trace of the GPU engine used to record none)."""
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.builder import build_engine
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.sampling_params import SamplingParams

    args = EngineArgs(model="tiny-llama", load_format="dummy", max_model_len=128,
                      num_gpu_blocks=64, num_host_blocks=0, max_num_seqs=4)
    sync = build_engine(args)
    counting = _Counting(sync.executor)
    engine = LLMEngine(sync.config.with_(scheduler=replace(sync.config.scheduler,
                                                           async_scheduling=True)),
                       counting, sync.tokenizer, sync.scheduler.kv, sync.block_bytes)
    recorder = RecordingExecutor(engine.executor)
    engine.executor = recorder
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    for i in range(3):
        engine.add_request(f"r{i}", [1 + i, 2, 3, 4], params)
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    assert engine.config.scheduler.async_scheduling and counting.executed == 0 and counting.launched == steps
    assert len(recorder.records) == steps - 1  # the last launch's result is read by close()
    engine.close()
    assert len(recorder.records) == steps
    assert all(r.issue_s is not None for r in recorder.records)
