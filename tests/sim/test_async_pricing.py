"""Async scheduling in the simulator: a step is priced as the async engine overlaps it (its
host time beside the previous step's device time: the larger of the two, not their sum), the
engine's decisions stay the synchronous engine's, and without the flag nothing changes."""

from __future__ import annotations

import pytest

from kvtier.costmodel.step_cost import StepCost
from kvtier.engine.args import EngineArgs
from kvtier.sampling_params import SamplingParams
from kvtier.sim import build_sim_engine

GREEDY = dict(temperature=0.0, ignore_eos=True, detokenize=False, max_tokens=24)


def test_an_overlapped_step_takes_the_larger_of_its_host_and_device_time():
    device_bound = StepCost(executor_s=5e-3, loop_s=0.2e-3, graph=True,
                            parts={"host": 1e-3, "layers": 3.8e-3, "head": 0.2e-3})
    assert device_bound.total_s == pytest.approx(5.2e-3)
    assert device_bound.overlapped_s == pytest.approx(4e-3)  # the host's 1.2 ms hidden
    host_bound = StepCost(executor_s=2e-3, loop_s=0.5e-3, graph=True,
                          parts={"host": 1.5e-3, "layers": 0.5e-3})
    assert host_bound.overlapped_s == pytest.approx(2e-3)  # 1.5 + 0.5 of host, 0.5 device
    whole = StepCost(executor_s=3e-3, loop_s=0.1e-3, graph=False, parts={"items": 3e-3})
    assert whole.overlapped_s == pytest.approx(3e-3)  # no host part: the loop alone hides


def _serve(async_scheduling: bool | None):
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", max_model_len=4096,
                      async_scheduling=async_scheduling)
    e = build_sim_engine(args, "h200", record_steps=True)
    for i in range(12):
        e.add_request(str(i), list(range(100 * i, 100 * i + 300 + 40 * i)),
                      SamplingParams(**GREEDY))
    while e.has_unfinished_requests():
        e.step()
    return e


def test_async_pricing_changes_the_clock_not_the_decisions():
    sync, overlapped, default = _serve(False), _serve(True), _serve(None)
    steps = [s.shape for s in sync.executor.steps]
    assert [s.shape for s in overlapped.executor.steps] == steps  # the same batches
    assert sync.executor.busy_s == pytest.approx(sum(s.cost.total_s for s in sync.executor.steps))
    assert overlapped.executor.busy_s == pytest.approx(
        sum(s.cost.overlapped_s for s in sync.executor.steps))
    assert overlapped.clock() < sync.clock()  # each step hides its host time
    assert default.clock() == sync.clock()  # left unset, the simulator steps synchronously
