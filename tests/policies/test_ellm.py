"""eLLM's adaptive mode against its per-step recompute budget (tensor-free: the real
scheduler and KV manager, a fake executor)."""

from __future__ import annotations

import random

import pytest

from kvtier.config import SchedulerConfig
from kvtier.core.request import Request
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.policies import get_policy
from kvtier.policies.ellm import EllmOptions
from kvtier.policies.ellm.planner.step_budget import FixedBudget, RidgeBudget
from kvtier.scheduler.scheduler import Scheduler
from tests.scheduler.fake_executor import FakeExecutor
from tests.scheduler.test_scheduler import request, run_to_end

BS, GROUPS = 4, 2


def make(step_budget, uncached_ratio=None, gpu_blocks=40, cap=64):
    kv = KVCacheManager(GROUPS, BS, gpu_blocks, 0, watermark=0.0)
    options = EllmOptions(uncached_ratio=uncached_ratio, max_uncached_ratio=0.6,
                            max_recompute_tokens=cap, step_budget=step_budget)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=128, max_num_seqs=12,
                                      max_model_len=64), kv, get_policy("ellm", options))
    return sched, FakeExecutor(GROUPS, BS, 12, cdiv(64, BS))


def arrivals(seed: int) -> dict[int, list[Request]]:
    rng = random.Random(seed)
    out: dict[int, list[Request]] = {}
    for i in range(14):
        out.setdefault(rng.randrange(0, 30), []).append(
            request(f"r{i}", rng.randrange(8, 30), rng.randrange(6, 30)))
    return out


class Watch:
    """Wraps the policy's make_room: after every call that dropped anything, the prefixes
    dropped in all must fit the budget of a decode step of the running requests."""

    def __init__(self, sched: Scheduler):
        self.sched, self.drops, self.loads = sched, 0, []
        policy, kv = sched.policy, sched.kv
        inner = policy.make_room

        def make_room(running, kv_, num_blocks):
            before = kv.num_dropped_token_blocks
            ok = inner(running, kv_, num_blocks)
            if kv.num_dropped_token_blocks > before:
                self.drops += 1
                load = sum(kv.num_dropped_tokens(r) for r in running)
                self.loads.append((load, policy.step_budget(running)))
            return ok

        policy.make_room = make_room


@pytest.mark.parametrize("seed", range(4))
def test_adaptive_drops_never_exceed_the_ridge_budget(seed):
    # Ridge at 40 tokens a step: the budget falls from 36 to 0 as the decodes grow to 40.
    budget = RidgeBudget(ridge=40.0, block_size=BS, cap=64)
    sched, ex = make(budget)
    watch = Watch(sched)
    finished = run_to_end(sched, ex, arrivals(seed))
    assert len(finished) == 14
    assert watch.drops > 0, "the workload must make the policy drop prefixes"
    for load, allowed in watch.loads:
        assert load <= allowed <= 36


def test_a_zero_budget_drops_nothing_and_preempts_instead():
    sched, ex = make(FixedBudget(0))
    watch = Watch(sched)
    run_to_end(sched, ex, arrivals(0))
    assert watch.drops == 0 and sched.counters.num_prefix_recompute_tokens == 0
    assert sched.counters.num_preemptions > 0


def test_without_a_priced_budget_the_cap_is_the_budget():
    # The old default (`--ellm-recompute-budget max`): up to max_recompute_tokens a step,
    # far past what a ridge budget allows on the same load.
    capped, ex = make(FixedBudget(64))
    Watch(capped)
    run_to_end(capped, ex, arrivals(1))
    ridge, ex = make(RidgeBudget(ridge=20.0, block_size=BS, cap=64))
    run_to_end(ridge, ex, arrivals(1))
    assert (capped.counters.num_prefix_recompute_tokens
            > ridge.counters.num_prefix_recompute_tokens)


def test_fixed_ratio_mode_ignores_the_step_budget():
    sched, ex = make(FixedBudget(0), uncached_ratio=0.5)
    run_to_end(sched, ex, arrivals(2))
    assert sched.counters.num_prefix_recompute_tokens > 0


def test_make_room_drops_all_or_nothing():
    # Two decoding requests of 12 tokens (3 blocks each, 2 droppable); a budget of one block
    # frees 2 physical blocks (one per group): enough for 2, not for 3.
    kv = KVCacheManager(GROUPS, BS, 12, 0, watermark=0.0)
    policy = get_policy("ellm", EllmOptions(max_uncached_ratio=0.9, max_recompute_tokens=64,
                                              step_budget=FixedBudget(BS)))
    reqs = []
    for i in range(2):
        r = request(f"r{i}", 12, 4)
        assert kv.allocate_slots(r, 12) is not None
        r.num_computed_tokens = 12
        reqs.append(r)
    assert not policy.make_room(reqs, kv, 3)
    assert kv.num_dropped_token_blocks == 0  # a partial drop would be paid for nothing
    assert policy.make_room(reqs, kv, 2)
    assert sum(kv.num_dropped_tokens(r) for r in reqs) == BS


def test_a_recompute_cap_the_step_budget_cannot_hold_is_refused():
    # With a cap of 4096 and 64-token steps, a fixed ratio drops 100 tokens of a 200-token
    # request: more than any step holds, so it was never scheduled again.
    from kvtier.config import ConfigError
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.assembly import check_config

    def config(cap: int):
        return EngineArgs(model="tiny-llama", load_format="dummy", kv_policy="ellm",
                          max_num_batched_tokens=256, max_model_len=256,
                          ellm_max_recompute_tokens=cap).create_engine_config()

    with pytest.raises(ConfigError, match="must be below max_num_batched_tokens"):
        check_config(config(256))
    check_config(config(255))
