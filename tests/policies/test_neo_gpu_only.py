"""NEO's GPU-only steps (kvtier/policies/neo/modes.py): a step may leave the CPU decodes out
when that predicts the better rate; none sits out more than --neo-max-skipped-steps steps
in a row, the greedy outputs equal a GPU-only run's (fp32, CPU), and the KV manager's
integrity holds after every step."""

from __future__ import annotations

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
    """The predictor always prefers leaving the CPU decodes out, where it may."""
    def best(self, shape, num_rows, host_tokens, gpu_only):
        return StepMode.GPU_ONLY if gpu_only and shape.num_reqs > num_rows \
            else StepMode.SEQUENTIAL

    monkeypatch.setattr(ModeChoice, "best", best)


def traced_run(**overrides) -> tuple[dict[str, list[int]], LLMEngine, list[tuple]]:
    """Outputs by id, the engine, and per step (host-running ids, scheduled ids, item
    kinds); integrity after every step."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        kv_policy="neo", **{**CAPPED, "neo_cpu_balance": 0.0, **overrides}))
    sched, trace = engine.scheduler, []
    schedule = sched.schedule

    def traced():
        plan = schedule()
        trace.append((set(sched.kv.host_running), {sr.request_id for sr in plan.scheduled},
                      {type(i) for i in plan.items}))
        return plan

    sched.schedule = traced  # type: ignore[method-assign]
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS)
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
