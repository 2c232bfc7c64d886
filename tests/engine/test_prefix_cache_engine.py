"""Prefix caching through the real scheduler and model runner (tiny Llama, fp32, CPU): greedy
outputs are identical with and without the cache for prompts that share prefixes, with
requests that hit, miss and partially hit in one batch, under recompute preemption and
eviction of cached blocks, for the recompute, swap, eLLM and HCache policies; every
invariant holds after every step."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvtier import SamplingParams
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.assembly import prefix_cache_config
from kvtier.engine.llm_engine import LLMEngine
from kvtier.policies.hcache import HiddenStore


def _engine(cache: bool, **kw) -> LLMEngine:
    opts = dict(model="tiny-llama", load_format="dummy", dtype="float32", max_model_len=96,
                block_size=4, layers_per_block=1, num_gpu_blocks=120, num_host_blocks=0,
                max_num_seqs=6, max_num_batched_tokens=48, kv_policy="recompute")
    opts.update(kw)
    eng = LLMEngine.from_engine_args(EngineArgs(enable_prefix_caching=cache, **opts))
    assert (eng.kv_manager.prefix_cache is not None) == cache
    return eng


def _prompts(seed: int = 0) -> list[list[int]]:
    """Two documents, each with several questions; exact repeats; unrelated prompts."""
    rng = random.Random(seed)
    docs = [[rng.randrange(5, 900) for _ in range(n)] for n in (37, 24)]
    out = []
    for i in range(14):
        doc = docs[i % 2]
        kind = i % 7
        if kind == 5:
            out.append(list(doc))  # the document alone: equal to a cached prefix
        elif kind == 6:
            out.append([rng.randrange(5, 900) for _ in range(rng.randrange(3, 30))])
        else:
            out.append(doc[: len(doc) - kind * 3] + [rng.randrange(5, 900)
                                                     for _ in range(rng.randrange(1, 9))])
    return out


def _serve(eng: LLMEngine, prompts, params, arrivals_per_step: int):
    """Requests arrive a few per step (later ones can hit earlier ones' blocks)."""
    pending = list(enumerate(prompts))
    finals, steps = {}, 0
    while pending or eng.has_unfinished_requests():
        for _ in range(arrivals_per_step):
            if pending:
                i, p = pending.pop(0)
                eng.add_request(str(i), p, params)
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0].token_ids
        eng.check_integrity()
        steps += 1
        assert steps < 3000
    return finals


@pytest.mark.parametrize("policy,num_gpu_blocks,async_scheduling", [
    ("recompute", 400, False), ("recompute", 140, False), ("recompute", 140, True),
    ("swap", 140, False), ("ellm", 140, False), ("hcache", 140, False),
    ("hcache", 140, True)])
def test_greedy_outputs_are_identical_with_and_without_the_cache(policy, num_gpu_blocks,
                                                                  async_scheduling):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    runs = {}
    for cache in (False, True):
        eng = _engine(cache, num_gpu_blocks=num_gpu_blocks, async_scheduling=async_scheduling,
                      kv_policy=policy, num_host_blocks=400, num_hidden_blocks=400)
        runs[cache] = _serve(eng, _prompts(), params, arrivals_per_step=2)
        kv, counters = eng.kv_manager, eng.scheduler.counters
        if cache:
            stats = kv.prefix_cache.stats
            assert stats.hits > 0 and stats.queries > stats.hits
            computed = counters.num_prompt_tokens
            if num_gpu_blocks < 400:
                assert counters.num_preemptions > 0 and stats.evicted_blocks > 0
            if num_gpu_blocks < 400 and policy == "recompute":
                assert stats.preempted_hits > 0  # re-admission after preemption hits
            kv.reset_prefix_cache()
        else:
            uncached = counters.num_prompt_tokens
        eng.close()
        assert kv.all_free()
    assert runs[True] == runs[False] and len(runs[True]) == len(_prompts())
    assert computed + stats.hits == uncached  # cached prompt tokens are not computed


def test_caching_is_on_by_default_under_every_policy_hcache_included():
    for policy in ("recompute", "swap", "ellm", "hcache"):
        eng = LLMEngine.from_engine_args(EngineArgs(
            model="tiny-llama", load_format="dummy", dtype="float32", max_model_len=96,
            block_size=4, num_gpu_blocks=120, num_host_blocks=8, kv_policy=policy))
        assert eng.kv_manager.prefix_cache is not None and eng.config.cache.enable_prefix_caching
        eng.close()


def test_a_hidden_state_store_that_cannot_start_after_a_hit_turns_caching_off():
    class NoSharing(HiddenStore):
        shares_blocks = False

    config = EngineArgs(model="tiny-llama", load_format="dummy",
                        kv_policy="hcache").create_engine_config()
    store = {"hidden_store": NoSharing(4, 4)}
    config_off, cache = prefix_cache_config(config, store)
    assert cache is None and config_off.cache.enable_prefix_caching is False
    asked = config.with_(cache=replace(config.cache, enable_prefix_caching=True))
    with pytest.raises(ConfigError, match="cannot start after a cache hit"):
        prefix_cache_config(asked, store)
    assert prefix_cache_config(config, {"hidden_store": HiddenStore(4, 4)})[1] is not None
