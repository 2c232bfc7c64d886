"""The prefix cache as callers see it (tiny Llama, fp32, CPU): RequestOutput.num_cached_tokens,
the engine's counters, LLM/engine.reset_prefix_cache(), and the bad inputs and faults of
issue 25 — each run step by step with check_integrity after every step, outputs compared
with an engine without the cache, and nothing leaked or freed while still referenced."""

from __future__ import annotations

import logging

import pytest

from kvtier import SamplingParams
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.entrypoints.llm import LLM
from kvtier.sampling_params import InvalidRequestError

BLOCK = 4
OPTIONS = dict(model="tiny-llama", load_format="dummy", dtype="float32", device="cpu",
               attention_backend="torch", max_model_len=96, block_size=BLOCK,
               layers_per_block=1, num_gpu_blocks=200, num_host_blocks=0, max_num_seqs=6,
               max_num_batched_tokens=64, kv_policy="recompute")
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
DOC = [17 + (7 * i) % 800 for i in range(21)]  # 5 full blocks and one token


def _engine(cache: bool = True, **kw) -> LLMEngine:
    eng = LLMEngine.from_engine_args(EngineArgs(enable_prefix_caching=cache, **{**OPTIONS, **kw}))
    assert (eng.kv_manager.prefix_cache is not None) == cache
    return eng


def _check_no_leak(eng: LLMEngine) -> None:
    """Every device block is free or held by the cache alone; the cache's are evictable."""
    kv = eng.kv_manager
    eng.check_integrity()
    assert kv.all_free()
    cached = kv.prefix_cache.num_evictable_device_blocks() if kv.prefix_cache else 0
    assert kv.gpu.num_used == cached
    stats = eng.get_stats()
    assert stats.gpu_blocks_used == 0 and stats.gpu_blocks_cached == cached


def _run(eng: LLMEngine, requests: dict[str, list[int]], params=GREEDY, each_step=None):
    """Add all requests, step to the end checking integrity; the final outputs by id."""
    for rid, prompt in requests.items():
        eng.add_request(rid, prompt, params)
    finals, steps = {}, 0
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        eng.check_integrity()
        if each_step is not None:
            each_step(steps)
        steps += 1
        assert steps < 500
    return finals


def _reference(requests: dict[str, list[int]], params=GREEDY) -> dict[str, list[int]]:
    eng = _engine(cache=False)
    outs = _run(eng, requests, params)
    eng.close()
    return {rid: o.outputs[0].token_ids for rid, o in outs.items()}


@pytest.fixture(scope="module")
def reference():
    requests = {"doc": DOC, "doc+q": DOC + [5, 6, 7, 8, 9], "doc-again": list(DOC),
                "three-blocks": DOC[:12], "one-block": DOC[:BLOCK], "other": [901, 902, 903]}
    return _reference(requests)


# ---- RequestOutput.num_cached_tokens and the counters ----------------------------------------
def test_num_cached_tokens_and_counters(reference):
    eng = _engine()
    first = _run(eng, {"doc": DOC})["doc"]
    assert first.num_cached_tokens == 0  # nothing cached yet: a miss is 0, not None
    later = _run(eng, {"doc+q": DOC + [5, 6, 7, 8, 9], "other": [901, 902, 903]})
    # The document's 5 full blocks (20 tokens) come from the cache; the rest is computed.
    assert later["doc+q"].num_cached_tokens == 20 and later["other"].num_cached_tokens == 0
    for rid, out in {"doc": first, **later}.items():
        assert out.outputs[0].token_ids == reference[rid]
    stats = eng.get_stats()
    assert stats.num_prefix_cache_queries_total == len(DOC) + len(DOC) + 5 + 3
    assert stats.num_prefix_cache_hits_total == 20
    assert stats.num_prefix_cache_preempted_queries_total == 0
    assert stats.num_prompt_tokens_total == len(DOC) + (len(DOC) + 5 - 20) + 3  # computed ones
    _check_no_leak(eng)
    eng.close()


def test_num_cached_tokens_is_the_first_admission_s_after_preemption():
    """A preempted request re-admitted with hits on its own blocks keeps its first count
    (vLLM's); the engine counts the re-admission apart."""
    eng = _engine(num_gpu_blocks=48, max_model_len=40, max_num_seqs=4, max_num_batched_tokens=32)
    prompts = {str(i): [100 * i + j for j in range(9)] for i in range(1, 5)}
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = _run(eng, prompts, params)
    assert sum(o.metrics.num_preemptions for o in outs.values()) > 0
    assert all(o.num_cached_tokens == 0 for o in outs.values())  # unique prompts
    stats = eng.get_stats()
    assert stats.num_prefix_cache_preempted_hits_total > 0
    assert stats.num_prefix_cache_hits_total == 0
    _check_no_leak(eng)
    eng.close()


def test_cache_off_reports_zero():
    eng = _engine(cache=False)
    outs = _run(eng, {"a": DOC, "b": list(DOC)})
    assert outs["a"].num_cached_tokens == outs["b"].num_cached_tokens == 0
    assert eng.get_stats().num_prefix_cache_queries_total == 0
    assert eng.reset_prefix_cache() is True  # nothing to drop: done, as vLLM answers
    _check_no_leak(eng)
    eng.close()


def test_n_greater_than_one_reports_the_first_sequence_s():
    eng = _engine()
    _run(eng, {"warm": DOC})
    out = _run(eng, {"x": DOC + [3, 4]}, SamplingParams(n=2, temperature=0.0, max_tokens=4,
                                                       ignore_eos=True))["x"]
    assert out.num_cached_tokens == 20 and len(out.outputs) == 2
    _check_no_leak(eng)
    eng.close()


# ---- reset ----------------------------------------------------------------------------------
def test_llm_reset_prefix_cache():
    llm = LLM("tiny-llama", **{k: v for k, v in OPTIONS.items() if k != "model"})
    kv = llm.engine.kv_manager
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    a = llm.generate([DOC], params)[0]
    b = llm.generate([DOC], params)[0]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 20)
    assert kv.prefix_cache.num_cached_blocks > 0
    assert llm.reset_prefix_cache() is True
    assert kv.prefix_cache.num_cached_blocks == 0 and kv.gpu.num_used == 0
    c = llm.generate([DOC], params)[0]
    assert c.num_cached_tokens == 0  # computed again after the reset
    assert a.outputs[0].token_ids == b.outputs[0].token_ids == c.outputs[0].token_ids
    llm.engine.check_integrity()
    llm.engine.close()


def test_reset_while_requests_run_is_refused_and_changes_nothing(reference, caplog):
    eng = _engine()
    kv = eng.kv_manager
    _run(eng, {"doc": DOC})
    answers = []

    def try_reset(step: int) -> None:
        if not eng.has_unfinished_requests():
            return
        index = dict(kv.prefix_cache.index)
        answers.append(eng.reset_prefix_cache())
        assert kv.prefix_cache.index == index  # refused: nothing dropped
        eng.check_integrity()

    with caplog.at_level(logging.WARNING, logger="kvtier.engine.llm_engine"):
        outs = _run(eng, {"doc+q": DOC + [5, 6, 7, 8, 9], "other": [901, 902, 903]},
                    each_step=try_reset)
    assert answers and not any(answers)
    assert "requests hold KV blocks" in caplog.text
    assert outs["doc+q"].num_cached_tokens == 20
    assert {r: o.outputs[0].token_ids for r, o in outs.items()} == {
        r: reference[r] for r in outs}
    _check_no_leak(eng)
    assert eng.reset_prefix_cache() is True  # once they finished
    assert kv.gpu.num_used == 0 and kv.prefix_cache.num_cached_blocks == 0
    eng.check_integrity()
    eng.close()


def test_reset_with_only_waiting_requests_is_allowed():
    """A waiting request holds no blocks: the reset goes ahead, and it then misses."""
    eng = _engine()
    _run(eng, {"doc": DOC})
    eng.add_request("w", DOC + [1], GREEDY)
    assert eng.reset_prefix_cache() is True
    out = _run(eng, {})["w"]
    assert out.num_cached_tokens == 0
    _check_no_leak(eng)
    eng.close()


# ---- bad input and faults -------------------------------------------------------------------
@pytest.mark.parametrize("prompt", [[], ""], ids=["no-ids", "no-text"])
def test_empty_prompt_is_refused_and_leaves_nothing(prompt):
    eng = _engine()
    _run(eng, {"doc": DOC})
    used = eng.kv_manager.gpu.num_used
    with pytest.raises(InvalidRequestError, match="prompt is empty"):
        eng.add_request("empty", prompt, GREEDY)
    assert not eng.has_unfinished_requests() and eng.kv_manager.gpu.num_used == used
    eng.add_request("empty", DOC[:3], GREEDY)  # the id was not taken by the refusal
    _run(eng, {})
    _check_no_leak(eng)
    eng.close()


def test_empty_prompt_fails_the_whole_generate_call():
    llm = LLM("tiny-llama", **{k: v for k, v in OPTIONS.items() if k != "model"})
    with pytest.raises(InvalidRequestError):
        llm.generate([DOC, []], GREEDY)
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()
    llm.engine.close()


def test_prompt_of_exactly_one_block_never_hits(reference):
    eng = _engine()
    outs = [_run(eng, {"one-block": DOC[:BLOCK]})["one-block"] for _ in range(2)]
    # Its block is cached (the first request computed it) but the last token must be
    # computed for logits, and it is in that block.
    assert eng.kv_manager.prefix_cache.num_cached_blocks >= 1
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert all(o.outputs[0].token_ids == reference["one-block"] for o in outs)
    _check_no_leak(eng)
    eng.close()


@pytest.mark.parametrize("rid,cached", [("doc-again", 20), ("three-blocks", 8)])
def test_prompt_equal_to_a_cached_one_computes_its_last_token(reference, rid, cached):
    """DOC (21 tokens) again: 5 blocks hit, the last token computed. DOC[:12] after DOC:
    every block of it is cached, but the last one is recomputed for the logits."""
    prompt = DOC if rid == "doc-again" else DOC[:12]
    eng = _engine()
    _run(eng, {"doc": DOC})
    computed_before = eng.get_stats().num_prompt_tokens_total
    out = _run(eng, {rid: list(prompt)})[rid]
    assert out.num_cached_tokens == cached
    assert eng.get_stats().num_prompt_tokens_total - computed_before == len(prompt) - cached
    assert out.outputs[0].token_ids == reference[rid]  # logits came from the computed token
    _check_no_leak(eng)
    eng.close()


def _shared_blocks_stay(eng: LLMEngine, holders: list[str]) -> None:
    """Every device block a live request's table holds is referenced, never free."""
    kv = eng.kv_manager
    free = set(kv.gpu._free)
    for rid in holders:
        table = kv.tables.get(rid)
        if table is None:
            continue
        for ids in table.block_ids:
            for b in ids:
                assert b not in free and kv.gpu.ref_count(b) >= 1, (rid, b)


@pytest.mark.parametrize("victim", ["a", "b"])
def test_abort_while_others_share_its_blocks(victim):
    """a computes the document; b and c hit its blocks. Aborting one of them mid-run
    frees only what nobody else holds; the others finish with the uncached outputs."""
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    prompts = {"a": DOC + [1, 2], "b": DOC + [3, 4, 5], "c": DOC + [6]}
    expected = _reference(prompts, params)
    eng = _engine()
    eng.add_request("a", prompts["a"], params)
    for _ in range(2):  # a's prefill (21 + 2 tokens) is planned; its blocks are cached
        eng.step()
        eng.check_integrity()
    finals = {}
    eng.add_request("b", prompts["b"], params)
    eng.add_request("c", prompts["c"], params)
    steps, aborted = 0, False
    while eng.has_unfinished_requests():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
        eng.check_integrity()
        steps += 1
        if steps == 3 and not aborted:
            shared = set(eng.kv_manager.tables[victim].block_ids[0]) & set(
                eng.kv_manager.tables["c"].block_ids[0])
            assert shared  # the document's blocks are in both tables
            eng.abort_request(victim)
            aborted = True
            eng.check_integrity()
            for b in shared:
                assert eng.kv_manager.gpu.ref_count(b) >= 2  # c's table and the cache
        _shared_blocks_stay(eng, ["a", "b", "c"])
        assert steps < 200
    assert aborted and victim not in finals
    assert finals["c"].num_cached_tokens == 20
    for rid, out in finals.items():
        assert out.outputs[0].token_ids == expected[rid]
    _check_no_leak(eng)
    eng.close()


def test_all_free_counts_cache_only_blocks_as_free():
    eng = _engine()
    kv = eng.kv_manager
    _run(eng, {"doc": DOC, "other": [901, 902, 903, 904, 905]})
    assert kv.gpu.num_used > 0  # the cache still holds the document's blocks
    assert kv.all_free()
    assert kv.gpu.num_used == kv.prefix_cache.num_evictable_device_blocks()
    eng.add_request("w", DOC + [1], GREEDY)
    eng.step()
    assert not kv.all_free()  # a request holds blocks now
    eng.abort_request("w")
    _check_no_leak(eng)
    eng.close()
