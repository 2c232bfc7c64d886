"""The host tier through the real scheduler and model runner (tiny Llama, fp32, CPU): a device
pool too small for the documents' prefixes forces evictions, later requests load their
prefixes back from the host pages (the io-backend kernel runs its Triton kernel under
TRITON_INTERPRET, the torch reference without; direct copies slices), and greedy outputs
are identical to caching off; both tiers' invariants hold after every step."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from kvtier import SamplingParams
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.offload.args import HostTierArgs
from kvtier.offload.install import enable_host_tier
from kvtier.offload.metrics import host_tier_families
from kvtier.offload.transfers import HostTierMemoryError


def _engine(cache: bool, **kw) -> LLMEngine:
    opts = dict(model="tiny-llama", load_format="dummy", dtype="float32", max_model_len=64,
                block_size=4, layers_per_block=2, num_gpu_blocks=48, num_host_blocks=0,
                max_num_seqs=4, max_num_batched_tokens=48, kv_policy="recompute")
    opts.update(kw)
    return LLMEngine.from_engine_args(EngineArgs(enable_prefix_caching=cache, **opts))


def _prompts(seed: int = 0, n: int = 16) -> list[list[int]]:
    """Four documents of 30-40 tokens, questions about them in random order."""
    rng = random.Random(seed)
    docs = [[rng.randrange(5, 900) for _ in range(rng.randrange(30, 41))] for _ in range(4)]
    return [docs[rng.randrange(4)] + [rng.randrange(5, 900) for _ in range(rng.randrange(1, 6))]
            for _ in range(n)]


def _serve(eng: LLMEngine, prompts, params):
    finals = {}
    for i, p in enumerate(prompts):  # one at a time, so later ones find earlier ones cached
        eng.add_request(str(i), p, params)
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out.outputs[0].token_ids
            eng.check_integrity()
    return finals


PARAMS = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture(scope="module")
def reference():
    return _serve(_engine(cache=False), _prompts(), PARAMS)


@pytest.mark.parametrize("backend,policy", [
    ("kernel", "write_through"), ("direct", "write_back"),
    ("kernel", "write_through_selective")])
def test_greedy_outputs_equal_caching_off_with_host_hits(reference, backend, policy):
    eng = _engine(cache=True)
    tier = enable_host_tier(eng, HostTierArgs(
        kv_offloading_size=0.01, hicache_io_backend=backend, hicache_write_policy=policy,
        hicache_write_through_threshold=1, hicache_min_load_blocks=1))  # tiny prompts' hits
    got = _serve(eng, _prompts(), PARAMS)
    assert got == reference
    kv = eng.kv_manager
    assert kv.prefix_cache.stats.evicted_blocks > 0
    assert tier.stats.hit_blocks > 0
    copies = eng.executor.copies.tier
    assert copies.counters.loaded_pages == tier.stats.loaded_pages > 0
    assert copies.counters.stored_pages == tier.stats.stored_pages > 0
    m = eng.get_stats().host_tier
    assert m is not None and m.host_hit_tokens == tier.stats.hit_blocks * kv.block_size
    assert m.loaded_bytes == tier.stats.loaded_pages * eng.block_bytes
    assert m.load_seconds > 0 and m.load_stall_seconds == m.load_seconds  # CPU: synchronous
    assert 0 < m.host_hit_rate < 1 and m.gpu_hit_rate + m.host_hit_rate <= 1
    text = _render(m)
    assert f'kvtier:prefix_cache_tier_hits_total{{tier="host"}} {m.host_hit_tokens:.1f}' in text
    assert 'kvtier:host_tier_bytes_total{direction="load"}' in text
    assert f"kvtier:host_tier_blocks_total {m.host_blocks_total:.1f}" in text


def _render(m) -> str:
    class One(Collector):
        def collect(self):
            yield from host_tier_families(m)
    registry = CollectorRegistry()
    registry.register(One())
    return generate_latest(registry).decode()


def test_flags_that_cannot_work_are_refused_with_the_option_named():
    eng = _engine(cache=True)
    with pytest.raises(ConfigError, match="layer_first"):
        enable_host_tier(eng, HostTierArgs(enable_hierarchical_cache=True,
                                           hicache_mem_layout="layer_first"))
    with pytest.raises(ConfigError, match="direct.*block"):
        enable_host_tier(eng, HostTierArgs(enable_hierarchical_cache=True,
                                           hicache_io_backend="direct",
                                           hicache_mem_layout="head_major"))
    with pytest.raises(ConfigError, match="not both"):
        enable_host_tier(eng, HostTierArgs(kv_offloading_size=1.0, hicache_ratio=2.0))
    with pytest.raises(ConfigError, match="prefix caching"):
        enable_host_tier(_engine(cache=False), HostTierArgs(kv_offloading_size=1.0))
    assert eng.kv_manager.prefix_cache.lower is None  # nothing was attached


def test_a_second_host_tier_is_refused_and_leaves_the_first_ones_pages():
    eng = _engine(cache=True)
    tier = enable_host_tier(eng, HostTierArgs(kv_offloading_size=0.01))
    copies = eng.executor.copies.tier
    with pytest.raises(ConfigError, match="has a host tier already"):
        enable_host_tier(eng, HostTierArgs(kv_offloading_size=0.02))
    assert eng.executor.copies.tier is copies and eng.kv_manager.prefix_cache.lower is tier


def test_a_pool_that_cannot_be_allocated_names_the_option_to_lower():
    eng = _engine(cache=True)
    with pytest.raises(HostTierMemoryError, match="lower --kv-offloading-size"):
        enable_host_tier(eng, HostTierArgs(kv_offloading_size=2.0**20))  # a PiB
    assert eng.kv_manager.prefix_cache.lower is None


def test_concurrent_requests_with_cache_aware_admission_and_prefetch_stay_exact():
    """Requests arrive while others run: delayed hits, prefetches in a step's background
    and ordinary loads all happen, through the real runner's copy path."""
    prompts = _prompts(seed=1, n=24)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)

    def serve(eng):
        finals, pending = {}, list(enumerate(prompts))
        while pending or eng.has_unfinished_requests():
            for _ in range(2):
                if pending:
                    i, p = pending.pop(0)
                    eng.add_request(str(i), p, params)
            for out in eng.step():
                if out.finished:
                    finals[out.request_id] = out.outputs[0].token_ids
            eng.check_integrity()
        return finals

    base = serve(_engine(cache=False, num_gpu_blocks=64))
    eng = _engine(cache=True, num_gpu_blocks=64)
    tier = enable_host_tier(eng, HostTierArgs(kv_offloading_size=0.01, hicache_prefetch=True,
                                              hicache_min_load_blocks=1))
    assert serve(eng) == base
    gate = eng.scheduler.admission_gate.stats
    assert tier.stats.prefetched_blocks > 0 and gate.prefetches > 0
    assert eng.get_stats().host_tier.prefetched_tokens == tier.stats.prefetched_blocks * 4
