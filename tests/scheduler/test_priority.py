"""vLLM's `--scheduling-policy priority`: waiting requests by (priority, arrival), lower
first; when blocks run out the running request of the highest value is preempted (the
newest among equals), even one already scheduled this step, whose entry and budget are then
taken back. A priority other than 0 without the policy is refused."""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.config import SchedulerConfig
from kvtier.core.request import Request, RequestStatus
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.entrypoints.llm import LLM
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.policies import get_policy
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.scheduler.queue import PriorityQueue, make_queue
from kvtier.scheduler.scheduler import Scheduler
from tests.scheduler.fake_executor import FakeExecutor
from tests.scheduler.test_scheduler import run_to_end


def request(rid: str, prompt_len: int, max_tokens: int, priority: int, arrival: float) -> Request:
    return Request(rid, list(range(100, 100 + prompt_len)),
                   SamplingParams(max_tokens=max_tokens, ignore_eos=True), max_tokens=max_tokens,
                   eos_token_ids=(1,), arrival_time=arrival, priority=priority)


def make(policy: str, gpu_blocks: int, host_blocks: int = 0, budget: int = 64, max_seqs: int = 8,
         num_groups: int = 1, block_size: int = 4, max_len: int = 40):
    kv = KVCacheManager(num_groups, block_size, gpu_blocks, host_blocks, watermark=0.0)
    cfg = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs,
                          max_model_len=max_len, schedule_policy="priority")
    return (Scheduler(cfg, kv, get_policy(policy)),
            FakeExecutor(num_groups, block_size, max_seqs, cdiv(max_len, block_size)))


def test_the_queue_orders_by_priority_then_arrival_and_a_preempted_one_returns_to_its_place():
    q = make_queue("priority")
    assert isinstance(q, PriorityQueue)
    for rid, prio, t in [("a", 1, 0.0), ("b", 0, 1.0), ("c", 1, 2.0), ("d", -1, 3.0), ("e", 0, 4.0)]:
        q.add(request(rid, 3, 2, prio, t))
    assert [r.request_id for r in q] == ["d", "b", "e", "a", "c"]
    d, b = q.pop(), q.pop()
    assert (d.request_id, b.request_id, q.peek().request_id) == ("d", "b", "e")
    q.prepend(b)  # preempted: ahead of e (it arrived first), not ahead of a higher priority
    q.add(request("f", 3, 2, -2, 5.0))
    assert [r.request_id for r in q] == ["f", "b", "e", "a", "c"]
    q.remove(next(r for r in q if r.request_id == "a"))
    assert [r.request_id for r in q] == ["f", "b", "e", "c"]


def test_the_lowest_priority_runner_is_preempted_even_when_scheduled_first():
    # 6 blocks of 4 tokens: two 11-token prompts fit (3 blocks each); the decode past 12
    # tokens needs a 4th. FCFS would preempt the newest (hi); here lo goes, though it was
    # admitted first and already scheduled in that step.
    sched, ex = make("recompute", gpu_blocks=6)
    lo, hi = request("lo", 11, 6, 5, 0.0), request("hi", 11, 6, 0, 1.0)
    sched.add_request(lo)
    plan = sched.schedule()  # lo alone first: it runs ahead of hi in the running list
    sched.update(plan, ex.execute(plan))
    sched.add_request(hi)
    preempted: list[str] = []
    while not preempted:
        plan = sched.schedule()
        preempted += plan.preempted_ids
        ids = [s.request_id for s in plan.scheduled]
        assert len(ids) == len(set(ids))
        sched.update(plan, ex.execute(plan))
        sched.check_integrity()
    assert preempted == ["lo"] and "lo" not in ids and "hi" in ids
    assert lo.status is RequestStatus.WAITING and sched.running == [hi]
    assert plan.num_scheduled_tokens == sum(s.num_new_tokens for s in plan.scheduled)


def test_a_victim_scheduled_this_step_swaps_out_only_its_written_blocks():
    # 5 blocks of 4 tokens. lo (7-token prompt) runs alone, then beside hi (8 tokens): both
    # hold 2 blocks, 8 tokens computed. Next step lo's decode takes a 3rd block (the last
    # free), then hi's needs one: lo, of the higher value, is preempted though scheduled.
    # The block it got this step holds nothing: the swap moves its 2 written blocks only.
    sched, ex = make("swap", gpu_blocks=5, host_blocks=8)
    lo, hi = request("lo", 7, 6, 5, 0.0), request("hi", 8, 6, 0, 1.0)
    sched.add_request(lo)
    for arrival in ([], [hi]):
        for r in arrival:
            sched.add_request(r)
        plan = sched.schedule()
        sched.update(plan, ex.execute(plan))
    plan = sched.schedule()
    assert plan.preempted_ids == ["lo"] and [s.request_id for s in plan.scheduled] == ["hi"]
    assert len(plan.swap_out) == 2
    sched.update(plan, ex.execute(plan))
    sched.check_integrity()
    finished = run_to_end(sched, ex, {})
    for r in (lo, hi):
        assert finished[r.request_id].output_token_ids == [
            ex.token_for(r.request_id, len(r.prompt_token_ids) + k) for k in range(6)]
    assert sched.kv.all_free()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=st.sampled_from(["recompute", "swap"]), extra_blocks=st.integers(0, 20),
       budget=st.integers(8, 64), max_seqs=st.integers(1, 6), seed=st.integers(0, 10_000))
def test_random_workloads_with_priorities_keep_integrity_and_their_tokens(
        policy, extra_blocks, budget, max_seqs, seed):
    max_len = 40
    sched, ex = make(policy, gpu_blocks=cdiv(max_len, 4) + extra_blocks, host_blocks=12,
                     budget=budget, max_seqs=max_seqs)
    rng = random.Random(seed)
    arrivals: dict[int, list[Request]] = {}
    for i in range(rng.randint(1, 12)):
        prompt = rng.randint(1, 30)
        step = rng.randint(0, 20)
        r = request(f"r{i}", prompt, rng.randint(1, max_len - prompt), rng.randint(-2, 2), step)
        arrivals.setdefault(step, []).append(r)
    finished = run_to_end(sched, ex, arrivals)
    for r in (r for rs in arrivals.values() for r in rs):
        done = finished[r.request_id]
        assert done.num_output_tokens == done.max_tokens
        assert done.output_token_ids == [ex.token_for(r.request_id, len(r.prompt_token_ids) + k)
                                         for k in range(done.max_tokens)]
    assert sched.kv.all_free()


def _engine(**kw) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(
        model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
        max_model_len=64, num_gpu_blocks=64, block_size=16, **kw))


def test_the_engine_runs_the_lower_value_first_and_refuses_priority_without_the_policy():
    fcfs = _engine()
    with pytest.raises(InvalidRequestError, match="scheduling-policy priority"):
        fcfs.add_request("x", [5, 6, 7], SamplingParams(max_tokens=2), priority=1)
    assert not fcfs.has_unfinished_requests()
    eng = _engine(schedule_policy="priority", max_num_seqs=1)
    for rid, prio in [("a", 2), ("b", 0), ("c", 1)]:
        eng.add_request(rid, [5, 6, 7, 8], SamplingParams(max_tokens=3), priority=prio)
    order, first_scheduled = [], {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                order.append(o.request_id)
                first_scheduled[o.request_id] = o.metrics.first_scheduled_time
    assert order == ["b", "c", "a"]
    # each stamped when it was admitted, not when an earlier-added one was
    assert first_scheduled["b"] < first_scheduled["c"] < first_scheduled["a"]


def test_llm_generate_takes_priorities_and_outputs_do_not_depend_on_them():
    prompts = [[5, 6, 7, 8 + i] for i in range(4)]
    params = SamplingParams(max_tokens=4, temperature=0.0)
    opts = dict(load_format="dummy", device="cpu", dtype="float32", max_model_len=64,
                num_gpu_blocks=64, block_size=16, max_num_seqs=2)
    plain = LLM("tiny-llama", **opts).generate(prompts, params)
    llm = LLM("tiny-llama", scheduling_policy="priority", **opts)
    ranked = llm.generate(prompts, params, priority=[3, 0, 2, 1])
    assert [o.outputs[0].token_ids for o in ranked] == [o.outputs[0].token_ids for o in plain]
    started = [o.metrics.first_scheduled_time for o in ranked]  # two at a time, by priority
    assert started[1] == started[3] < started[0] == started[2]
    with pytest.raises(ValueError, match="one priority per prompt"):
        llm.generate(prompts, params, priority=[0])


def test_taking_back_a_partial_prefill_frees_its_partial_place():
    from kvtier.scheduler.prefill_budget import PrefillChunker
    from kvtier.scheduler.step_builder import StepBuilder

    chunker = PrefillChunker(threshold=4, max_partial=1)
    step = StepBuilder(64, chunker)
    r = request("p", 10, 2, 0, 0.0)
    step.add(r, chunker.chunk(10, 10), ((),), reset=True)  # 4 of 10: partial
    assert chunker.chunk(10, 10) == 0  # the step's one partial place is taken
    assert step.unschedule(r) == 4 and step.entries == []
    assert chunker.chunk(10, 10) == 4


def test_a_waiting_request_ahead_of_the_swapped_ones_is_admitted_before_them():
    # 4 blocks of 4 tokens: low (value 5) and mid (1) hold 2 each; mid's 3rd block swaps
    # low out. high (0) then arrives: it goes before low, swapped or not, and takes the
    # one free block, while low waits to come back (FCFS would hold high behind it).
    sched, ex = make("swap", gpu_blocks=4, host_blocks=8)
    low, mid = request("low", 7, 8, 5, 0.0), request("mid", 7, 8, 1, 1.0)
    high = request("high", 3, 2, 0, 2.0)
    for r in (low, mid):
        sched.add_request(r)
    preempted: list[str] = []
    while not preempted:
        plan = sched.schedule()
        preempted += plan.preempted_ids
        sched.update(plan, ex.execute(plan))
    assert preempted == ["low"] and list(sched.swapped) == [low]
    sched.add_request(high)
    plan = sched.schedule()
    assert "high" in [s.request_id for s in plan.scheduled] and list(sched.swapped) == [low]
    sched.update(plan, ex.execute(plan))
    finished = run_to_end(sched, ex, {})
    assert set(finished) == {"low", "mid", "high"} and sched.kv.all_free()
    q = make_queue("priority")
    assert list(q.resume_order(deque([low, high, mid]))) == [high, mid, low]
    assert not make_queue("fcfs").precedes(high, low)
