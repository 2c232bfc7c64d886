"""DirectKV's balance (kvtier/policies/host_resident/balance.py, cheaper_than_recompute): a
decode moves to the host only where what its host reads add to each step it still runs,
the per-layer fixed cost included when it is the first host row, costs less than
recomputing its context once; otherwise the scheduler preempts."""

from __future__ import annotations

import math

from kvtier.core.request import Request
from kvtier.costmodel.hardware import HostAttention
from kvtier.policies.directkv import price_zero_copy_rows
from kvtier.policies.host_resident.balance import HostBalance, cheaper_than_recompute
from kvtier.sampling_params import SamplingParams
from tests.policies.test_host_resident_engine import run

P = SamplingParams(max_tokens=16)


def balance(factor: float = 1.0) -> HostBalance:
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, CostModelConfig
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    cm = CostModel(mc, get_hardware("h200"), None, CostModelConfig(block_bytes=1 << 20))
    return HostBalance(cm, price_zero_copy_rows, factor, pays=cheaper_than_recompute)


def decode(name: str, ctx: int, remaining: int) -> Request:
    """A running decode whose step attends over `ctx` tokens, `remaining` tokens to go."""
    req = Request(name, [1] * (ctx - 1), P, remaining)
    req.num_computed_tokens = ctx - 1
    return req


def break_even(b: HostBalance, ctx: int, host_tokens: int = 0) -> float:
    """Remaining tokens at which hosting a decode of `ctx` costs what recomputing it does."""
    cm = b.cost_model
    before = price_zero_copy_rows(cm, host_tokens) if host_tokens else 0.0
    return b.recompute_s(ctx) / (price_zero_copy_rows(cm, host_tokens + ctx) - before)


def test_a_move_that_would_not_pay_is_refused_and_one_that_would_is_allowed():
    b = balance()
    running = [decode(f"g{i}", 2048, 128) for i in range(8)]
    even = break_even(b, 2048)
    assert 1 < even < 128  # the batch's own requests (128 tokens to go) do not pay
    long_lived = decode("long", 2048, 128)
    assert not b.mover([*running, long_lived], set())(long_lived)
    nearly_done = decode("done", 2048, max(1, math.floor(even / 2)))
    assert b.mover([*running, nearly_done], set())(nearly_done)
    refused = decode("late", 2048, math.ceil(even * 2))
    assert not b.mover([*running, refused], set())(refused)


def test_the_first_host_row_pays_the_fixed_cost_and_later_ones_do_not():
    b = balance()
    layers = b.cost_model.mc.num_layers
    fixed = b.cost_model.hw.host_attention_cost(HostAttention.ZERO_COPY).layer_s * layers
    assert fixed > 0
    first, later = break_even(b, 2048), break_even(b, 2048, host_tokens=2048)
    assert later > first  # a second row adds only its bytes
    # Between the two break-evens: refused as the first host row, allowed beside one.
    req = decode("mid", 2048, math.floor((first + later) / 2))
    assert not b.mover([req], set())(req)
    host = decode("h", 2048, 8)
    assert b.mover([host, req], {"h"})(req)


def test_the_factor_scales_the_limit_and_candidates_add_up():
    running = [decode(f"g{i}", 2048, 128) for i in range(4)]
    long_lived = decode("long", 2048, 128)
    assert not balance(1.0).mover([*running, long_lived], set())(long_lived)
    assert balance(1e3).mover([*running, long_lived], set())(long_lived)
    # Once one moved, the next candidate's added cost is its bytes only: one that pays only
    # beside a host row is refused alone, and moves once a short-lived one has moved.
    b = balance()
    first, later = break_even(b, 2048), break_even(b, 2048, host_tokens=2048)
    mid, short = decode("mid", 2048, math.floor((first + later) / 2)), decode("s", 2048, 2)
    assert not b.mover([mid, short], set())(mid)
    may_move = b.mover([mid, short], set())
    assert may_move(short) and may_move(mid)


def test_the_default_balance_refuses_every_move_and_the_outputs_equal_gpu_only():
    # tiny-llama's recompute is far cheaper than the H200's fixed cost of host rows.
    gpu_only, _, _ = run("recompute", num_gpu_blocks=256)
    outputs, engine, host_steps = run("directkv", directkv_balance=1.0)
    placement = engine.scheduler.policy
    assert placement.options.balance_rule is not None
    assert placement.num_refused_by_system > 0 and placement.num_moved_out == 0
    assert host_steps == 0 and engine.get_stats().num_preemptions_total > 0
    assert outputs == gpu_only
