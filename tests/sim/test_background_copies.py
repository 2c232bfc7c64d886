"""Background copies (backups, prefetches) in the simulator: a step does not wait for its
own, the next step waits for what of them is left, as the runner's join of the copy stream
makes it (kvtier/runner/swap_copies.py)."""

from __future__ import annotations

import pytest

import kvtier.offload  # noqa: F401 - registers the host tier's item kinds
from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.costmodel.step_cost import StepCost
from kvtier.kv.host_tier_items import HostBackup, HostLoad
from kvtier.sampling_params import SamplingParams
from kvtier.sim.clock import VirtualClock
from kvtier.sim.executor import SimulatedExecutor

STEP_S = 0.010
COPY_S_PER_PAGE = 0.004


class FixedCosts:
    """Every step STEP_S; a background copy COPY_S_PER_PAGE a page (the host tier's
    `background` hook at a fixed rate)."""

    def predict(self, shape) -> StepCost:
        return StepCost(STEP_S, 0.0, False)

    def background_seconds(self, shape) -> float:
        return sum(n * COPY_S_PER_PAGE for k, n in shape.items if k == HostBackup.kind)


def _plan(*items) -> StepPlan:
    req = ScheduledRequest("r", [1], 5, ((),), False, True, SamplingParams(), 0)
    return StepPlan(scheduled=[req], items=list(items))


def _run(plans) -> list[float]:
    clock = VirtualClock()
    ex = SimulatedExecutor(FixedCosts(), clock, token_id=1)
    times = []
    for plan in plans:
        t0 = clock.now()
        ex.execute(plan)
        times.append(clock.now() - t0)
    return times


def test_the_next_step_waits_for_what_is_left_of_the_background_copies():
    backup = HostBackup(gpu_blocks=tuple(range(5)), host_pages=tuple(range(5)))  # 20 ms
    times = _run([_plan(backup), _plan(), _plan(), _plan()])
    assert times[0] == pytest.approx(STEP_S)  # its own copies run beside it
    assert times[1] == pytest.approx(5 * COPY_S_PER_PAGE)  # 10 ms left, then its 10 ms
    assert times[2:] == pytest.approx([STEP_S, STEP_S])


def test_copies_that_end_within_the_step_cost_the_next_nothing():
    backup = HostBackup(gpu_blocks=(1, 2), host_pages=(3, 4))  # 8 ms < one step
    load = HostLoad("r", host_pages=(6,), gpu_blocks=(5,), groups=(0,))  # no background hook
    assert _run([_plan(backup, load), _plan()]) == pytest.approx([STEP_S, STEP_S])


def test_the_host_tier_prices_its_backups_and_prefetches_as_background_copies():
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, CostModelConfig
    from kvtier.costmodel.shape import StepShape
    from kvtier.kv.host_tier_items import HostPrefetchDirect
    from kvtier.model.loader import resolve_model_config
    from kvtier.offload.items import copy_seconds

    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    cm = CostModel(mc, get_hardware("h200"), None, CostModelConfig(block_bytes=256 << 10))
    shape = StepShape(items=((HostBackup.kind, 64), (HostLoad.kind, 32),
                             (HostPrefetchDirect.kind, 16)))
    expected = (copy_seconds(cm, 64, to_device=False)
                + copy_seconds(cm, 16, to_device=True, direct=True))  # the load: serial, not here
    assert cm.background_seconds(shape) == pytest.approx(expected)
    assert expected > 0
