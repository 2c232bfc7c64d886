"""Greedy outputs token-identical to HF transformers' generate, for each supported family."""

import pytest

from kvtier import LLM, SamplingParams
from tests.hf_models import ARCHS, hf_greedy, save_tiny_model

PROMPTS = [[5, 17, 42, 99, 3, 250], [7] * 3, list(range(10, 60)), [300, 301, 302, 7, 8, 9, 10, 11, 12, 13, 14]]
NEW_TOKENS = 32


@pytest.fixture(scope="module", params=sorted(ARCHS))
def tiny_any(request, tmp_path_factory):
    """Every supported family: the plain exactness check."""
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    return path, hf_greedy(path, PROMPTS, NEW_TOKENS)


@pytest.fixture(scope="module", params=["llama-mha", "qwen3"])
def tiny(request, tmp_path_factory):
    """MHA and GQA + q/k norm + tied embeddings: the cache-layout, chunking, preemption and
    partial-caching variants (what they change does not depend on the family)."""
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    return path, hf_greedy(path, PROMPTS, NEW_TOKENS)


def run_kvtier(path, **options):
    options.setdefault("max_model_len", 256)
    llm = LLM(str(path), dtype="float32", device="cpu", **options)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    return [o.outputs[0].token_ids for o in outs], llm.engine.get_stats()


def test_greedy_matches_hf(tiny_any):
    path, expected = tiny_any
    got, _ = run_kvtier(path)
    assert got == expected


@pytest.mark.parametrize("layers_per_block", [1, 2, 4])
def test_layers_per_block_do_not_change_outputs(tiny, layers_per_block):
    path, expected = tiny
    got, _ = run_kvtier(path, layers_per_block=layers_per_block)
    assert got == expected


@pytest.mark.parametrize("chunk", [7, 16, 33])
def test_chunked_prefill_does_not_change_outputs(tiny, chunk):
    path, expected = tiny
    got, _ = run_kvtier(path, max_num_batched_tokens=chunk)
    assert got == expected


@pytest.mark.parametrize("policy", ["recompute", "swap"])
def test_forced_preemption_does_not_change_outputs(tiny, policy):
    path, expected = tiny
    # 4 layers, F=2 -> two groups; the 4 requests need 2 x 15 blocks of 16 tokens at the end,
    # the pool has 14: they cannot all stay resident and are preempted again and again.
    got, stats = run_kvtier(path, kv_policy=policy, num_gpu_blocks=14, block_size=16,
                            layers_per_block=2, max_model_len=96)
    assert got == expected
    assert stats.num_preemptions_total >= 3
    assert stats.num_prompt_tokens_total == sum(map(len, PROMPTS))  # re-prefills not counted
    if policy == "swap":
        assert stats.num_swap_out_blocks_total > 0
        assert stats.num_swap_in_blocks_total == stats.num_swap_out_blocks_total
    else:
        assert stats.num_recomputed_tokens_total > 0


@pytest.mark.parametrize("ratio", [0.3, 0.6])
def test_ellm_fixed_uncached_ratio_is_exact(tiny, ratio):
    path, expected = tiny
    got, stats = run_kvtier(path, kv_policy="ellm", ellm_uncached_ratio=ratio, block_size=4,
                            layers_per_block=2)
    assert got == expected
    assert stats.num_prefix_recompute_tokens_total > 0


def test_ellm_under_memory_pressure_is_exact_and_drops_instead_of_preempting(tiny):
    path, expected = tiny
    small = dict(num_gpu_blocks=26, block_size=8, layers_per_block=2, max_model_len=96)
    got, stats = run_kvtier(path, kv_policy="ellm", ellm_max_uncached_ratio=0.7, **small)
    assert got == expected
    assert stats.num_prefix_recompute_tokens_total > 0
    _, base = run_kvtier(path, kv_policy="recompute", **small)
    assert stats.num_preemptions_total < base.num_preemptions_total


class _AlternatingPlanner:
    """Stands in for the planner (whose economics tests/planner checks; on this tiny load
    it rightly keeps r = 0): r = 0.6, 0.2, 0.6, ... so planned mode drops more mid-run."""

    def __init__(self):
        self.num_solves = 0

    def solve(self, contexts, max_wait_s=0.0):
        from kvtier.policies.ellm.planner.request_level import Decision

        self.num_solves += 1
        return Decision(len(contexts), 0.6 if self.num_solves % 2 else 0.2, 0.0, True, 0.0)


def test_ellm_planned_ratio_is_exact(tiny):
    from dataclasses import replace

    path, expected = tiny
    llm = LLM(str(path), dtype="float32", device="cpu", kv_policy="ellm", ellm_planner=True,
              ellm_max_uncached_ratio=0.6, num_gpu_blocks=26, block_size=8, layers_per_block=2,
              max_model_len=96)
    policy = llm.engine.scheduler.policy
    assert policy.options.planner is not None  # --ellm-planner built one
    policy.options = replace(policy.options, planner=_AlternatingPlanner(), replan_every=4)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    llm.engine.check_integrity()
    assert [o.outputs[0].token_ids for o in outs] == expected
    assert policy.options.planner.num_solves > 2
    assert llm.engine.get_stats().num_prefix_recompute_tokens_total > 0


def test_hcache_restores_kv_from_hidden_states_exactly(tiny):
    path, expected = tiny
    small = dict(num_gpu_blocks=14, block_size=16, layers_per_block=2, max_model_len=96)
    got, stats = run_kvtier(path, kv_policy="hcache", **small)
    assert got == expected
    assert stats.num_preemptions_total >= 3
    assert stats.num_recomputed_tokens_total == 0  # every victim came back by re-projection
    assert stats.num_restored_tokens_total > 0


@pytest.mark.parametrize("policy", ["recompute", "ellm"])
def test_piecewise_pieces_are_exact(tiny, policy):
    # On the CPU the pieces run eagerly through the static buffers the GPU graphs use.
    path, expected = tiny
    extra = dict(ellm_uncached_ratio=0.5) if policy == "ellm" else {}
    got, _ = run_kvtier(path, kv_policy=policy, piecewise_graphs=True, block_size=4,
                        max_num_batched_tokens=40, **extra)
    assert got == expected
