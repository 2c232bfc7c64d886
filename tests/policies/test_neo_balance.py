"""NEO's balance (kvtier/policies/neo/balance.py): a decode moves to the host only while the
CPU attention of all host decodes stays under the step's predicted GPU time (times
--neo-cpu-balance); a refused move falls back to the scheduler's preemption, and the greedy
outputs still equal a GPU-only run's."""

from __future__ import annotations

from kvtier.core.request import Request
from kvtier.policies.neo import price_cpu_rows
from kvtier.policies.neo.balance import CpuBalance
from kvtier.sampling_params import SamplingParams
from tests.policies.test_host_resident_engine import run

P = SamplingParams(max_tokens=16)


def balance(factor: float = 1.0, fitted: bool = False) -> CpuBalance:
    """The rule over the H200 profile; without its fitted host-row costs (`fitted` False)
    the CPU side is priced by its bytes alone, which these tests of the rule's sums use."""
    import dataclasses

    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, CostModelConfig
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    hw = get_hardware("h200")
    if not fitted:
        hw = dataclasses.replace(hw, host_attention={})
    cm = CostModel(mc, hw, None, CostModelConfig(block_bytes=1 << 20))
    return CpuBalance(cm, price_cpu_rows, factor)


def decode(name: str, ctx: int) -> Request:
    """A running decode whose step attends over `ctx` tokens."""
    req = Request(name, [1] * (ctx - 1), P, 16)
    req.num_computed_tokens = ctx - 1
    return req


def prefill(name: str, n: int) -> Request:
    return Request(name, [1] * n, P, 16)


def test_a_move_is_refused_when_the_cpu_side_would_set_the_step_time():
    running = [decode(f"g{i}", 512) for i in range(4)]
    # 8,192 tokens of KV (1 GiB) on the CPU against a 5-row decode step on the GPU: refused.
    assert not balance().mover([*running, long := decode("long", 8192)], set())(long)
    # 64 tokens are hidden under it.
    assert balance().mover([*running, short := decode("short", 64)], set())(short)


def test_the_fitted_round_trip_is_hidden_only_under_a_long_step():
    running = [decode(f"g{i}", 512) for i in range(4)]
    # Priced as the H200 runs it, the CPU round trip's per-layer cost alone outlasts a
    # 5-row decode step: even 64 tokens are refused...
    assert not balance(fitted=True).mover([*running, short := decode("short", 64)],
                                          set())(short)
    # ...while a long prefill chunk on the GPU hides them.
    busy = [*running, prefill("p", 8192), short]
    assert balance(fitted=True).mover(busy, set())(short)


def test_the_host_side_adds_up_and_the_gpu_work_raises_the_limit():
    cands = [decode(f"c{i}", 1024) for i in range(8)]
    may_move = balance().mover(cands, set())
    moved = [may_move(r) for r in reversed(cands)]
    # Newest first: the first ones fit, then the CPU side's sum outgrows the GPU step.
    assert moved[0] and not moved[-1] and moved == sorted(moved, reverse=True)
    # A 4,096-token prefill's chunk on the GPU hides more of them...
    with_prefill = balance().mover([*cands, prefill("p", 4096)], set())
    assert sum(with_prefill(r) for r in reversed(cands)) > sum(moved)
    # ...and requests already on the host count against the limit.
    host = {r.request_id for r in cands[:6]}
    crowded = balance().mover(cands, host)
    assert sum(crowded(r) for r in reversed(cands[6:])) < min(2, sum(moved))


def test_the_factor_scales_the_limit():
    running = [decode(f"g{i}", 512) for i in range(4)]
    long = decode("long", 8192)
    assert not balance(1.0).mover([*running, long], set())(long)
    assert balance(100.0).mover([*running, long], set())(long)


def test_a_tiny_balance_refuses_every_move_and_the_outputs_equal_gpu_only():
    gpu_only, _, _ = run("recompute", num_gpu_blocks=256)
    outputs, engine, host_steps = run("neo", neo_cpu_balance=1e-9)
    placement = engine.scheduler.policy
    assert placement.num_refused_by_system > 0 and placement.num_moved_out == 0
    assert host_steps == 0 and engine.get_stats().num_preemptions_total > 0
    assert outputs == gpu_only


def test_the_sums_count_every_decode_and_the_prefill_chunks_the_scheduler_gives():
    """A prefill that takes the whole token budget leaves the decodes behind it unscheduled
    this step, but they are the movers (the newest): their rows stay in the sums, so moving
    them never takes the GPU side below zero; the prefill counts with its chunk."""
    from kvtier.policies.host_resident.balance import StepSums
    from kvtier.policies.host_resident.step_tokens import StepTokens

    running = [prefill("p", 9000), decode("a", 512), decode("b", 512)]
    sums = StepSums(running, set(), StepTokens(8192))
    assert (sums.gpu_rows, sums.gpu_ctx_sum, sums.prefills) == (2, 1024, ((8192, 0),))
    sums.move(512)
    sums.move(512)
    assert (sums.gpu_rows, sums.gpu_ctx_sum, sums.host_rows) == (0, 0, 2)
