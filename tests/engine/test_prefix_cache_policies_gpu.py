"""Prefix caching is exact on the GPU too (Triton kernels, CUDA graphs, async scheduling), in
fp32: greedy outputs with the cache equal those without it and HF transformers', under
every policy, on test_prefix_cache_policies' workload (a hit, a miss and a partial hit in
one step, forced preemption, eviction mid-run). bf16 agreement is a report, not a test:
benchmarks/policies/bench_prefix_cache_agreement.py."""

import pytest

from tests.engine.test_prefix_cache_policies import NEW_TOKENS, POLICIES, PROMPTS, _serve
from tests.hf_models import hf_greedy, save_tiny_model

DEVICE = "cuda"


@pytest.fixture(scope="module")
def tiny_gqa(tmp_path_factory):
    path = save_tiny_model("llama-gqa", tmp_path_factory.mktemp("llama-gqa"))
    return path, hf_greedy(path, PROMPTS, NEW_TOKENS)


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(POLICIES))
def test_gpu_fp32_cached_and_uncached_greedy_outputs_are_identical(tiny_gqa, name):
    path, expected = tiny_gqa
    options = {"kv_policy": name, "num_gpu_blocks": 48, **POLICIES[name]}
    runs = {}
    for cache in (False, True):
        runs[cache], eng, _ = _serve(path, cache, device=DEVICE, **options)
        assert eng.scheduler.counters.num_preemptions > 0
        if cache:
            assert eng.kv_manager.prefix_cache.stats.hits > 0
            eng.kv_manager.reset_prefix_cache()
        eng.close()
        assert eng.kv_manager.all_free()
    assert runs[True] == runs[False] == expected
