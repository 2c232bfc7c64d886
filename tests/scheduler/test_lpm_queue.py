"""SGLang's longest-prefix-match order (`--schedule-policy lpm`): the waiting requests whose
leading blocks the prefix cache holds go first, the longest first, arrival order among
equals, preempted requests before all; past LPM_MAX_WAITING, or with no cache, arrival
order. Outputs do not depend on the order; on a cache too small for every prefix, lpm
serves the cached prefix's requests before the others evict it."""

from __future__ import annotations

import random

import pytest

from kvtier.config import ConfigError
from kvtier.core.request import Request
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import SamplingParams
from kvtier.scheduler import queue as queues
from kvtier.scheduler.queue import LPM_MAX_WAITING, LongestPrefixQueue, make_queue


class FakeCache:
    """admission_hashes by a request's first token: that many blocks cached."""

    lower = None

    def admission_hashes(self, req: Request):
        n = req.prompt_token_ids[0]
        return list(range(n + 2)), n


def req(rid: str, cached: int) -> Request:
    return Request(rid, [cached, 1, 2], SamplingParams(), max_tokens=4)


def test_the_longest_cached_prefix_goes_first_arrival_order_among_equals():
    q = LongestPrefixQueue()
    for rid, cached in [("a", 0), ("b", 3), ("c", 1), ("d", 3), ("e", 0)]:
        q.add(req(rid, cached))
    q.reorder(FakeCache())
    assert [r.request_id for r in q] == ["b", "d", "c", "a", "e"]
    q.prepend(req("p", 0))  # preempted: first, whatever its prefix
    q.add(req("f", 5))
    q.reorder(FakeCache())
    assert [r.request_id for r in q] == ["p", "f", "b", "d", "c", "a", "e"]
    assert q.pop().request_id == "p"
    q.remove(next(r for r in q if r.request_id == "d"))
    q.reorder(FakeCache())
    assert [r.request_id for r in q] == ["f", "b", "c", "a", "e"]


def test_arrival_order_without_a_cache_or_past_the_cut_off():
    q = LongestPrefixQueue()
    for i in range(3):
        q.add(req(f"r{i}", i))
    q.reorder(None)
    assert [r.request_id for r in q] == ["r0", "r1", "r2"]
    for i in range(3, LPM_MAX_WAITING + 1):
        q.add(req(f"r{i}", i % 4))
    q.reorder(FakeCache())
    assert [r.request_id for r in q][:3] == ["r0", "r1", "r2"]


def test_the_policy_is_checked():
    assert type(make_queue("fcfs")) is queues.FCFSQueue
    with pytest.raises(ConfigError, match="schedule-policy"):
        EngineArgs(model="tiny-llama", load_format="dummy", device="cpu",
                   schedule_policy="random").create_engine_config()


def serve(policy: str) -> tuple[dict[str, list[int]], int]:
    """Two documents' questions, one at a time (one seat), queued B A B A ... behind a
    first A: the pool holds one document's prefix, not both."""
    eng = LLMEngine.from_engine_args(EngineArgs(
        model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
        max_model_len=256, num_gpu_blocks=18, block_size=16, max_num_seqs=1,
        schedule_policy=policy))
    rng = random.Random(0)
    docs = {d: [rng.randrange(100, 4000) for _ in range(160)] for d in "AB"}
    order = ["A"] + ["B", "A"] * 4
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
    for i, d in enumerate(order):
        eng.add_request(f"{d}{i}", docs[d] + [rng.randrange(100, 4000) for _ in range(8)], params)
    outs: dict[str, list[int]] = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                outs[out.request_id] = out.outputs[0].token_ids
        eng.check_integrity()
    assert eng.scheduler.kv.all_free()
    return outs, eng.get_stats().num_prefix_cache_hits_total


def test_lpm_serves_the_cached_document_first_and_changes_no_output():
    fcfs, fcfs_hits = serve("fcfs")
    lpm, lpm_hits = serve("lpm")
    assert lpm == fcfs
    assert lpm_hits > fcfs_hits
