"""Scheduler + KV manager + policies over randomized workloads, with a tensor-free executor."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.config import SchedulerConfig
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.policies import get_policy
from kvtier.policies.ellm import EllmOptions
from kvtier.policies.hcache import HiddenStore
from kvtier.sampling_params import SamplingParams
from kvtier.scheduler.scheduler import Scheduler
from tests.scheduler.fake_executor import FakeExecutor


def make(policy: str, num_groups=2, block_size=4, gpu_blocks=24, host_blocks=24, budget=32,
         max_seqs=8, max_len=40):
    hidden = host_blocks if policy == "hcache" else None
    kv = KVCacheManager(num_groups, block_size, gpu_blocks, host_blocks, watermark=0.0,
                        hidden_store=HiddenStore(hidden, block_size) if hidden else None)
    options = EllmOptions(max_uncached_ratio=0.6, max_recompute_tokens=budget // 2)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                                      max_model_len=max_len), kv, get_policy(policy, options))
    ex = FakeExecutor(num_groups, block_size, max_seqs, cdiv(max_len, block_size))
    return sched, ex


def request(rid: str, prompt_len: int, max_tokens: int) -> Request:
    return Request(rid, list(range(100, 100 + prompt_len)),
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True), max_tokens=max_tokens,
                   eos_token_ids=(1,))


def run_to_end(sched, ex, arrivals, aborts=(), max_steps=2000):
    """arrivals: {step: [Request]}; aborts: {step: [request_id]}; returns finished requests."""
    finished = {}
    step = 0
    while step < max_steps:
        for r in arrivals.get(step, []):
            sched.add_request(r)
        for rid in dict(aborts).get(step, []):
            sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        if step > max(arrivals, default=0) and not sched.num_unfinished:
            break
        plan = sched.schedule()
        assert plan.num_scheduled_tokens <= sched.config.max_num_batched_tokens
        assert len(sched.running) <= sched.config.max_num_seqs
        result = ex.execute(plan)
        for r in sched.update(plan, result):
            if r.status.finished:
                finished[r.request_id] = r
        sched.check_integrity()
        step += 1
    assert step < max_steps, "the workload did not finish (livelock?)"
    return finished


def test_decodes_come_first_and_chunked_prefill_respects_budget():
    sched, ex = make("recompute", budget=10)
    sched.add_request(request("a", 3, 4))
    plan = sched.schedule()
    assert [(s.request_id, s.num_new_tokens) for s in plan.scheduled] == [("a", 3)]
    sched.update(plan, ex.execute(plan))
    sched.add_request(request("b", 25, 2))
    plan = sched.schedule()
    # a decodes (1 token), b's prompt is chunked to the remaining 9 of the 10-token budget.
    assert [(s.request_id, s.num_new_tokens, s.sample) for s in plan.scheduled] == [
        ("a", 1, True), ("b", 9, False)]


def test_preempts_newest_first_recompute():
    # 1 group, 4-token blocks, 6 blocks: two requests of 9-token prompts fit (3 blocks each),
    # the first decode step beyond 12 tokens needs a 4th block and evicts the newest.
    sched, ex = make("recompute", num_groups=1, gpu_blocks=6, host_blocks=0, budget=64)
    a, b = request("a", 11, 6), request("b", 11, 6)
    sched.add_request(a)
    sched.add_request(b)
    preempted = []
    while sched.num_unfinished:
        plan = sched.schedule()
        preempted += plan.preempted_ids
        sched.update(plan, ex.execute(plan))
        sched.check_integrity()
        if "b" in preempted:
            break
    assert preempted[0] == "b"
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0
    assert sched.counters.num_recomputed_tokens >= 11


def test_swap_preemption_moves_blocks_and_brings_them_back():
    sched, ex = make("swap", num_groups=1, gpu_blocks=6, host_blocks=6, budget=64)
    reqs = [request("a", 11, 6), request("b", 11, 6)]
    finished = run_to_end(sched, ex, {0: reqs})
    assert set(finished) == {"a", "b"}
    c = sched.counters
    assert c.num_preemptions >= 1
    assert c.num_swap_out_blocks > 0 and c.num_swap_in_blocks == c.num_swap_out_blocks
    assert c.num_recomputed_tokens == 0
    assert sched.kv.all_free()


def test_swap_falls_back_to_recompute_when_host_is_full():
    sched, ex = make("swap", num_groups=1, gpu_blocks=6, host_blocks=1, budget=64)
    finished = run_to_end(sched, ex, {0: [request("a", 11, 6), request("b", 11, 6)]})
    assert len(finished) == 2
    assert sched.counters.num_recomputed_tokens > 0
    assert sched.kv.all_free()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(["recompute", "swap", "ellm", "hcache"]),
    num_groups=st.integers(1, 3),
    block_size=st.sampled_from([2, 4, 8]),
    extra_blocks=st.integers(0, 30),
    host_blocks=st.integers(0, 40),
    budget=st.integers(8, 64),
    max_seqs=st.integers(1, 6),
    seed=st.integers(0, 10_000),
)
def test_random_workloads_keep_integrity_and_finish(
    policy, num_groups, block_size, extra_blocks, host_blocks, budget, max_seqs, seed
):
    max_len = 40
    # The pool must hold one max-length request (the engine refuses smaller pools).
    gpu_blocks = num_groups * cdiv(max_len, block_size) + extra_blocks
    sched, ex = make(policy, num_groups, block_size, gpu_blocks, host_blocks, budget, max_seqs,
                     max_len)
    rng = random.Random(seed)
    arrivals: dict[int, list[Request]] = {}
    ids = []
    for i in range(rng.randint(1, 12)):
        prompt = rng.randint(1, 30)
        r = request(f"r{i}", prompt, rng.randint(1, max_len - prompt))
        arrivals.setdefault(rng.randint(0, 20), []).append(r)
        ids.append(r.request_id)
    aborts = {rng.randint(0, 30): [rng.choice(ids)] for _ in range(rng.randint(0, 3))}
    finished = run_to_end(sched, ex, arrivals, aborts)
    aborted = {rid for v in aborts.values() for rid in v}
    for rid in set(ids) - aborted:
        r = finished[rid]
        assert r.num_output_tokens == r.max_tokens
        # Tokens depend only on (request, position): preemption must not change them.
        assert r.output_token_ids == [
            ex.token_for(rid, r.num_prompt_tokens + k) for k in range(r.max_tokens)]
    assert sched.kv.all_free()
    sched.check_integrity()


@pytest.mark.parametrize("policy", ["swap", "hcache"])
def test_a_request_swapped_out_that_needs_the_whole_pool_comes_back_once_nothing_runs(policy):
    # 10 blocks of 16 tokens, a watermark of 1: a (140-token prompt, admitted in a 128-token
    # chunk beside b) grows to 9 blocks; its 10th does not fit beside b's one, and a, the
    # newest, is swapped out. Once b finishes the pool is empty, and a, which needs all 10
    # blocks, must come back: the watermark protects running requests, and none runs.
    kv = KVCacheManager(1, 16, 10, 20, watermark=0.1,
                        hidden_store=HiddenStore(20, 16) if policy == "hcache" else None)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=129, max_num_seqs=4,
                                      max_model_len=160), kv, get_policy(policy))
    ex = FakeExecutor(1, 16, 4, 10)
    a = request("a", 140, 19)
    finished = run_to_end(sched, ex, {0: [request("b", 1, 15)], 1: [a]}, max_steps=200)
    assert set(finished) == {"a", "b"} and a.num_preemptions == 1
    assert a.output_token_ids == [ex.token_for("a", 140 + k) for k in range(19)]
    assert kv.all_free()
