"""Prefix caching is exact under every memory policy (issue 25's exactness target), on the
HF-exactness tiny checkpoints (tests/hf_models.py), CPU, fp32: greedy outputs with the cache
equal those without it and HF transformers' own, for recompute, swap, eLLM (on demand and at
a fixed uncached ratio) and HCache, with requests that hit, miss and partially hit admitted
in one step, forced preemption and eviction of cached blocks mid-run; every invariant holds
after every step and nothing is held after the last."""

from __future__ import annotations

import random

import pytest

from kvtier import SamplingParams
from kvtier.core.request import RequestStatus
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from tests.hf_models import hf_greedy, save_tiny_model

NEW_TOKENS = 12
BLOCK = 4


def _prompts() -> list[list[int]]:
    """Two documents with a question each, then, arriving three a step: a prompt equal to an
    earlier one (a full hit), an unrelated one (a miss) and another question on a document
    (a partial hit)."""
    rng = random.Random(3)
    docs = [[rng.randrange(3, 500) for _ in range(n)] for n in (30, 22)]
    out = [docs[0] + [7, 8, 9], docs[1] + [10, 11]]
    for i in range(6):
        doc = docs[i % 2]
        out += [list(out[i % 2]),
                [rng.randrange(3, 500) for _ in range(rng.randrange(5, 20))],
                doc[: len(doc) - 2 * i] + [rng.randrange(3, 500) for _ in range(3)]]
    return out


PROMPTS = _prompts()


@pytest.fixture(scope="module", params=["llama-mha", "qwen3"])
def tiny(request, tmp_path_factory):
    path = save_tiny_model(request.param, tmp_path_factory.mktemp(request.param))
    return path, hf_greedy(path, PROMPTS, NEW_TOKENS)


def _serve(path, cache: bool, device: str = "cpu", **options):
    """The two documents first, to the end; then the rest, three arriving a step.
    (outputs, engine, per step the (hit tokens, prompt tokens) of each request admitted)."""
    eng = LLMEngine.from_engine_args(EngineArgs(
        model=str(path), dtype=options.pop("dtype", "float32"), device=device,
        enable_prefix_caching=cache,
        block_size=BLOCK, layers_per_block=2, max_model_len=64, max_num_seqs=6,
        max_num_batched_tokens=40, num_host_blocks=200, **options))
    kv = eng.kv_manager
    tried: list = []
    admit = kv.admit

    def recording_admit(req):
        hit = admit(req)
        tried.append((req, hit))
        return hit

    kv.admit = recording_admit  # type: ignore[method-assign]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    finals, admitted = {}, []

    def step() -> None:
        tried.clear()
        for out in eng.step():
            if out.finished:
                finals[int(out.request_id)] = out.outputs[0].token_ids
        # An admission rolled back (no room) leaves the request waiting: not admitted.
        admitted.append([(hit, r.num_prompt_tokens) for r, hit in tried
                         if r.status is not RequestStatus.WAITING])
        eng.check_integrity()
        assert len(admitted) < 2000

    for i in (0, 1):
        eng.add_request(str(i), PROMPTS[i], params)
    while eng.has_unfinished_requests():
        step()
    pending = list(enumerate(PROMPTS))[2:]
    while pending or eng.has_unfinished_requests():
        for i, p in pending[:3]:
            eng.add_request(str(i), p, params)
        del pending[:3]
        step()
    return [finals[i] for i in range(len(PROMPTS))], eng, admitted


POLICIES = {
    "recompute": {},
    "swap": {},
    "ellm": dict(ellm_max_uncached_ratio=0.7),
    "ellm-fixed": dict(kv_policy="ellm", ellm_uncached_ratio=0.5),
    "hcache": dict(num_hidden_blocks=400),
}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_cached_and_uncached_greedy_outputs_are_identical(tiny, name):
    path, expected = tiny
    options = {"kv_policy": name, **POLICIES[name]}
    # 24 token blocks x 2 layer groups: the two documents fit (21), six requests of up to
    # 45 tokens (12 each) do not.
    options.setdefault("num_gpu_blocks", 48)
    runs = {}
    for cache in (False, True):
        runs[cache], eng, admitted = _serve(path, cache, **options)
        kv, counters = eng.kv_manager, eng.scheduler.counters
        assert counters.num_preemptions > 0  # and each policy's own way out of it:
        assert {"swap": counters.num_swap_out_blocks, "hcache": counters.num_restored_tokens,
                "recompute": counters.num_recomputed_tokens}.get(
                    name, counters.num_prefix_recompute_tokens) > 0
        if cache:
            pc = kv.prefix_cache.stats
            assert pc.hits > 0 and pc.evicted_blocks > 0
            assert name in ("swap", "hcache") or pc.preempted_hits > 0  # re-admissions hit
            # One step admitted a hit, a miss and a partial hit (of a shorter prefix).
            assert any({h == 0 for h, _ in step} == {True, False}
                       and len({h for h, _ in step if h}) >= 2 for step in admitted)
            kv.reset_prefix_cache()
        eng.close()
        assert kv.all_free()
    assert runs[True] == runs[False] == expected
