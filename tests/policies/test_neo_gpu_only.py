"""NEO's GPU-only steps (kvtier/policies/neo/modes.py): a step may leave the CPU decodes out
when that predicts the better rate; none sits out more than --neo-max-skipped-steps steps
in a row, the greedy outputs equal a GPU-only run's (fp32, CPU), and the KV manager's
integrity holds after every step."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.policies.host_resident import MoveToDevice, MoveToHost
from kvtier.policies.neo import NeoOptions
from kvtier.policies.neo.modes import ModeChoice
from kvtier.policies.neo.steps import StepMode
from tests.policies.test_host_resident_engine import CAPPED, PARAMS, prompts, run


def test_the_flag_parses_and_is_checked():
    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", "neo",
                                    "--neo-max-skipped-steps", "2"])
    options = EngineArgs.from_cli_args(ns).create_engine_config().policy_options
    assert isinstance(options, NeoOptions) and options.max_skipped_steps == 2
    assert NeoOptions().max_skipped_steps == 4
    with pytest.raises(ConfigError, match="--neo-max-skipped-steps"):
        EngineArgs(model="tiny-llama", kv_policy="neo", neo_max_skipped_steps=-1
                   ).create_engine_config()
    with pytest.raises(ConfigError, match="--neo-max-skipped-steps"):
        EngineArgs(model="tiny-llama", kv_policy="swap", neo_max_skipped_steps=2
                   ).create_engine_config()


@pytest.fixture
def gpu_only_wins(monkeypatch):
    """The predictor always prefers leaving every CPU decode out that it may."""
    monkeypatch.setattr(ModeChoice, "best_hold", lambda self, shape, ctx, max_held: max_held)
    monkeypatch.setattr(ModeChoice, "best", lambda self, *a, **k: StepMode.SEQUENTIAL)


@pytest.fixture
def one_held(monkeypatch):
    """The predictor leaves exactly one CPU decode out where it may (a step partly held)."""
    monkeypatch.setattr(ModeChoice, "best_hold",
                        lambda self, shape, ctx, max_held: min(1, max_held))
    monkeypatch.setattr(ModeChoice, "best", lambda self, *a, **k: StepMode.SEQUENTIAL)


def traced_run(priorities: list[int] | None = None,
               watch: Callable[[LLMEngine], None] | None = None, **overrides
               ) -> tuple[dict[str, list[int]], LLMEngine, list[tuple]]:
    """Outputs by id, the engine, and per step (host-running ids, scheduled ids, item
    kinds); integrity after every step. `watch` sees the engine before the first step."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        kv_policy="neo", **{**CAPPED, "neo_cpu_balance": 0.0, **overrides}))
    if watch is not None:
        watch(engine)
    sched, trace = engine.scheduler, []
    schedule = sched.schedule

    def traced():
        plan = schedule()
        trace.append((set(sched.kv.host_running), {sr.request_id for sr in plan.scheduled},
                      {type(i) for i in plan.items}))
        return plan

    sched.schedule = traced  # type: ignore[method-assign]
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS, priority=priorities[i] if priorities else 0)
    outputs: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        engine.check_integrity()
    assert sched.kv.all_free()
    return outputs, engine, trace


def longest_wait(trace) -> int:
    """The most steps in a row a host-running request was not scheduled."""
    waits: dict[str, int] = {}
    most = 0
    for host, scheduled, _ in trace:
        waits = {r: waits.get(r, 0) + 1 for r in host if r not in scheduled}
        most = max(most, *waits.values(), 0)
    return most


def test_gpu_only_steps_keep_the_outputs_and_no_cpu_decode_starves(gpu_only_wins):
    reference, _, _ = run("recompute", num_gpu_blocks=256)
    outputs, engine, trace = traced_run(neo_max_skipped_steps=2)
    policy = engine.scheduler.policy
    assert policy.num_gpu_only_steps > 5 and policy.num_moved_out > 0
    assert longest_wait(trace) == 2  # the bound binds, and holds
    assert any(host & scheduled for host, scheduled, _ in trace)  # they do run
    assert outputs == reference
    # Requests come back from the host, and never in the step one goes out.
    assert policy.num_moved_in > 0
    assert not any({MoveToHost, MoveToDevice} <= kinds for _, _, kinds in trace)


def test_zero_skips_never_leaves_them_out(gpu_only_wins):
    _, engine, trace = traced_run(neo_max_skipped_steps=0)
    assert engine.scheduler.policy.num_gpu_only_steps == 0 and longest_wait(trace) == 0


def test_a_step_may_leave_some_cpu_decodes_out(one_held):
    reference, _, _ = run("recompute", num_gpu_blocks=256)
    outputs, engine, trace = traced_run(neo_max_skipped_steps=2)
    policy = engine.scheduler.policy
    assert policy.num_partly_held_steps > 0
    # a step ran some host-running requests and left another out
    assert any(len(host) > 1 and host & scheduled and host - scheduled
               for host, scheduled, _ in trace)
    assert longest_wait(trace) <= 2
    assert outputs == reference


class _Rule:
    def __init__(self, holds: bool):
        self._holds = holds

    def holds(self, shape, num_rows, host_tokens) -> bool:
        return self._holds

    def batch0_s(self, shape, num_rows, host_tokens) -> float:
        return 0.0

    def holds_beside(self, batch0_s, num_rows, host_tokens) -> bool:
        return self._holds


class _Prices:
    """10 ms a step, 1 ms a row; CPU decodes beyond the first two stick out 2 ms each."""

    def seconds(self, shape, num_rows, host_tokens, mode) -> float:
        return 0.010 + 0.001 * shape.num_reqs + max(0.0, 0.002 * (num_rows - 2))


def test_the_count_held_is_the_best_predicted_rate():
    from kvtier.costmodel.shape import StepShape
    from kvtier.policies.neo.modes import hold_candidates

    choice = ModeChoice(_Prices(), _Rule(holds=True))  # type: ignore[arg-type]
    shape = StepShape(num_decodes=8, decode_ctx_sum=8000, decode_ctx_max=1000)
    # rates for 0..4 held: 8/22, 7/19, 6/16, 5/15, 4/14 (per ms): two held is best
    assert choice.best_hold(shape, (1000,) * 4, max_held=4) == 2
    assert choice.best_hold(shape, (1000,) * 4, max_held=1) == 1  # bounded by starvation
    assert choice.best_hold(shape, (1000,) * 4, max_held=0) == 0
    # Where the rest would not pipeline (NEO's rule fails), none or all are left out.
    no_rule = ModeChoice(_Prices(), _Rule(holds=False))  # type: ignore[arg-type]
    assert no_rule.best_hold(shape, (1000,) * 4, max_held=4) == 0
    assert hold_candidates(3) == [0, 1, 2, 3]
    many = hold_candidates(100)
    assert many[0] == 0 and many[-1] == 100 and len(many) == 9



def test_a_held_back_cpu_decode_preempted_by_priority_gives_back_its_host_blocks(
        gpu_only_wins):
    """Under priority scheduling the victim is the running request of the worst priority,
    which may be a CPU decode this step leaves out (ahead of the scheduler's place in
    `running`): it is preempted as any other, its host blocks freed (integrity every step,
    all free at the end), and the outputs hold."""
    reference, _, _ = run("recompute", num_gpu_blocks=256)
    held_victims: list[str] = []

    def watch(engine: LLMEngine) -> None:
        sched = engine.scheduler
        held: set[str] = set()
        before_step, preempt = sched.policy.before_step, sched._preempt

        def holding(running, kv, waiting=()):
            before_step(running, kv, waiting)
            held.clear()
            held.update(r.request_id for r in running[:sched.policy.num_held_back(running)])

        def recording(req, step):
            if req.request_id in held:
                held_victims.append(req.request_id)
            preempt(req, step)

        sched.policy.before_step = holding  # type: ignore[method-assign]
        sched._preempt = recording  # type: ignore[method-assign]

    # The newest arrivals have the worst priority: they move out first, and are the victims.
    outputs, _, _ = traced_run(list(range(len(prompts()))), watch,
                               schedule_policy="priority", num_gpu_blocks=20,
                               num_host_blocks=24, neo_max_skipped_steps=2)
    assert held_victims, "no held-back CPU decode was preempted: the case is not reached"
    assert outputs == reference
