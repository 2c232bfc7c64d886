"""Long-prefill controls: a prompt's chunk per step is capped (long_prefill_token_threshold)
and at most max_num_partial_prefills prefills stop part-way in one step."""

from __future__ import annotations

import random

import pytest

from kvtier.config import ConfigError, SchedulerConfig
from kvtier.engine.args import DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD, EngineArgs
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.policies import get_policy
from kvtier.policies.ellm import EllmOptions
from kvtier.policies.hcache import HiddenStore
from kvtier.scheduler.prefill_budget import PrefillChunker
from kvtier.scheduler.scheduler import Scheduler
from tests.scheduler.fake_executor import FakeExecutor
from tests.scheduler.test_scheduler import request, run_to_end


def make(threshold: int, max_partial: int = 1, policy: str = "recompute", budget: int = 32,
         gpu_blocks: int = 64, max_len: int = 64):
    kv = KVCacheManager(2, 4, gpu_blocks, 64, watermark=0.0,
                        hidden_store=HiddenStore(64, 4) if policy == "hcache" else None)
    config = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=max_len,
                             long_prefill_token_threshold=threshold,
                             max_num_partial_prefills=max_partial)
    options = EllmOptions(max_uncached_ratio=0.6, max_recompute_tokens=budget // 2)
    sched = Scheduler(config, kv, get_policy(policy, options))
    return sched, FakeExecutor(2, 4, 8, cdiv(max_len, 4))


def steps(sched, ex, num_steps: int) -> list[list[tuple[str, int]]]:
    """Each step's (request id, tokens scheduled), in plan order (decodes first)."""
    out = []
    for _ in range(num_steps):
        plan = sched.schedule()
        out.append([(s.request_id, s.num_new_tokens) for s in plan.scheduled])
        sched.update(plan, ex.execute(plan))
        sched.check_integrity()
    return out


def test_chunker_caps_long_prefills_and_counts_partial_ones():
    chunker = PrefillChunker(threshold=8, max_partial=1)
    assert chunker.chunk(1, 1) == 1  # a decode
    assert chunker.chunk(5, 5) == 5  # a short prompt, whole
    assert chunker.chunk(30, 30) == 8  # long: capped, now partial (1 of 1)
    assert chunker.chunk(20, 20) == 0  # would be a second partial prefill
    assert chunker.chunk(8, 8) == 8  # whole at the cap: not partial
    assert chunker.chunk(20, 3) == 0  # cut by the budget: partial too
    unlimited = PrefillChunker(threshold=0, max_partial=1)
    assert unlimited.chunk(30, 12) == 12 and unlimited.chunk(30, 12) == 0


def test_threshold_caps_the_chunk_and_one_partial_prefill_runs_at_a_time():
    sched, ex = make(threshold=8)
    for r in (request("b", 30, 2), request("c", 20, 2), request("d", 5, 2)):
        sched.add_request(r)
    assert steps(sched, ex, 6) == [
        [("b", 8)],  # c would be a second partial prefill: it waits (d behind it, FCFS)
        [("b", 8)],
        [("b", 8)],
        [("b", 6), ("c", 8), ("d", 5)],  # b completes; c starts; d fits whole
        [("b", 1), ("d", 1), ("c", 8)],  # decodes first
        [("c", 4)],  # b and d finished (2 tokens each)
    ]


def test_several_partial_prefills_share_the_step():
    sched, ex = make(threshold=8, max_partial=2)
    for r in (request("b", 30, 2), request("c", 20, 2), request("d", 12, 2)):
        sched.add_request(r)
    assert steps(sched, ex, 3) == [
        [("b", 8), ("c", 8)],  # d would be a third partial prefill
        [("b", 8), ("c", 8)],
        [("b", 8), ("c", 4), ("d", 8)],  # c completes: d may start
    ]


def test_without_a_threshold_the_budget_alone_cuts_prefills():
    sched, ex = make(threshold=0)
    for r in (request("b", 30, 2), request("c", 20, 2)):
        sched.add_request(r)
    assert steps(sched, ex, 2) == [[("b", 30), ("c", 2)], [("b", 1), ("c", 18)]]


def test_decodes_are_never_held_back_by_a_waiting_partial_prefill():
    sched, ex = make(threshold=4)
    sched.add_request(request("a", 3, 6))
    sched.add_request(request("b", 10, 2))
    assert steps(sched, ex, 4) == [
        [("a", 3), ("b", 4)],
        [("a", 1), ("b", 4)],
        [("a", 1), ("b", 2)],
        [("a", 1), ("b", 1)],
    ]


@pytest.mark.parametrize("policy", ["recompute", "swap", "ellm", "hcache"])
@pytest.mark.parametrize("threshold,max_partial", [(6, 1), (5, 3)])
def test_random_workloads_finish_with_capped_chunks(policy, threshold, max_partial):
    """Under memory pressure (preemption, swap-in, dropped prefixes) every request still
    finishes, and no prompt chunk exceeds the threshold."""
    rng = random.Random(7)
    sched, ex = make(threshold, max_partial, policy, budget=24, gpu_blocks=24, max_len=40)
    arrivals: dict[int, list] = {}
    for i in range(24):
        arrivals.setdefault(rng.randrange(40), []).append(
            request(f"r{i}", rng.randrange(2, 30), rng.randrange(1, 10)))
    chunks = []
    schedule = sched.schedule

    def recording_schedule():
        plan = schedule()
        chunks.extend(s.num_new_tokens for s in plan.scheduled if not s.sample)
        partial = sum(1 for s in plan.scheduled if not s.sample)
        assert partial <= max_partial
        return plan

    sched.schedule = recording_schedule  # type: ignore[method-assign]
    finished = run_to_end(sched, ex, arrivals)
    assert len(finished) == 24
    assert sched.counters.num_preemptions + sched.counters.num_prefix_recompute_tokens > 0
    assert chunks and max(chunks) <= threshold


@pytest.mark.parametrize("seed", range(6))
def test_a_chunk_that_is_not_scheduled_frees_its_partial_place(monkeypatch, seed):
    """Under priority scheduling a partial prefill that preempts itself (or a waiting one
    that finds no room) gives its place back: the step's count of partial prefills is
    always the plan's."""
    import kvtier.scheduler.scheduler as scheduler_module

    chunkers: list[PrefillChunker] = []

    class Recorded(PrefillChunker):
        @classmethod
        def for_step(cls, config):
            chunkers.append(super().for_step(config))
            return chunkers[-1]

    monkeypatch.setattr(scheduler_module, "PrefillChunker", Recorded)
    rng = random.Random(seed)
    kv = KVCacheManager(2, 4, 20, 64, watermark=0.0)  # one request of max_model_len fits
    config = SchedulerConfig(max_num_batched_tokens=16, max_num_seqs=6, max_model_len=40,
                             long_prefill_token_threshold=5, max_num_partial_prefills=2,
                             schedule_policy="priority")
    sched, ex = Scheduler(config, kv, get_policy("recompute")), FakeExecutor(2, 4, 6, 10)
    arrivals: dict[int, list] = {}
    for i in range(20):
        r = request(f"r{i}", rng.randrange(6, 30), rng.randrange(1, 8))
        r.priority = rng.randrange(3)
        arrivals.setdefault(rng.randrange(30), []).append(r)
    schedule = sched.schedule

    def checked_schedule():
        plan = schedule()
        partial = sum(1 for s in plan.scheduled if not s.sample)
        assert chunkers[-1].num_partial == partial
        return plan

    sched.schedule = checked_schedule  # type: ignore[method-assign]
    assert len(run_to_end(sched, ex, arrivals)) == 20
    assert sched.counters.num_preemptions > 0


def test_config_checks_and_vllm_default_threshold():
    with pytest.raises(ConfigError, match="long_prefill_token_threshold"):
        SchedulerConfig(long_prefill_token_threshold=-1)
    with pytest.raises(ConfigError, match="max_num_partial_prefills"):
        SchedulerConfig(max_num_partial_prefills=0)
    with pytest.raises(ConfigError, match="need chunked prefill"):
        SchedulerConfig(enable_chunked_prefill=False, max_num_batched_tokens=4096,
                        long_prefill_token_threshold=512)
    # vLLM: several partial prefills and no threshold -> 4 % of max_model_len.
    assert SchedulerConfig(max_model_len=10000, max_num_partial_prefills=4
                           ).effective_long_prefill_threshold == 400
    assert SchedulerConfig(long_prefill_token_threshold=512).effective_long_prefill_threshold == 512


def test_engine_args_flags_reach_the_scheduler_config():
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    ns = parser.parse_args(["tiny-llama", "--long-prefill-token-threshold", "512",
                            "--max-num-partial-prefills", "2"])
    sched = EngineArgs.from_cli_args(ns).create_engine_config().scheduler
    assert (sched.long_prefill_token_threshold, sched.max_num_partial_prefills) == (512, 2)
    off = EngineArgs(model="tiny-llama", enable_chunked_prefill=False, max_model_len=512)
    assert off.create_engine_config().scheduler.long_prefill_token_threshold == 0
    default = EngineArgs(model="tiny-llama").create_engine_config().scheduler
    assert default.long_prefill_token_threshold == DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD > 0


def test_offline_llm_leaves_prompt_chunks_uncapped():
    from kvtier import LLM

    llm = LLM("tiny-llama", load_format="dummy", device="cpu", max_model_len=64,
              num_gpu_blocks=16, num_host_blocks=16)
    assert llm.engine.config.scheduler.long_prefill_token_threshold == 0
    capped = LLM("tiny-llama", load_format="dummy", device="cpu", max_model_len=64,
                 num_gpu_blocks=16, num_host_blocks=16, long_prefill_token_threshold=16)
    assert capped.engine.config.scheduler.long_prefill_token_threshold == 16
