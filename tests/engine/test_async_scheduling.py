"""Async scheduling (step N+1 scheduled and launched before step N's tokens are read) must
give exactly the outputs of the synchronous engine, keep every invariant after every step,
and never schedule a request past its last token."""

from __future__ import annotations

import argparse
import random

import pytest

from kvtier import SamplingParams
from kvtier.core.plan import PLACEHOLDER_TOKEN
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.runner.model_runner import ModelRunner


def _engine(**kw) -> LLMEngine:
    opts = dict(model="tiny-llama", load_format="dummy", max_model_len=80, num_gpu_blocks=10,
                num_host_blocks=40, max_num_seqs=6, max_num_batched_tokens=64)
    opts.update(kw)
    return LLMEngine.from_engine_args(EngineArgs(**opts))


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 900) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def _serve(eng: LLMEngine, prompts, params, abort_at: dict[int, str] | None = None):
    """Every request's final output; integrity checked after every step."""
    for i, p in enumerate(prompts):
        eng.add_request(str(i), p, params)
    finals, steps = {}, 0
    while eng.has_unfinished_requests():
        if abort_at and steps in abort_at:
            eng.abort_request(abort_at[steps])
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out.outputs[0]
        eng.check_integrity()
        steps += 1
        assert steps < 2000
    eng.close()
    assert eng.scheduler.kv.all_free()
    return finals


@pytest.mark.parametrize("policy", ["recompute", "swap", "ellm", "hcache"])
def test_async_equals_sync_under_preemption(policy):
    params = SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True)
    sync_eng = _engine(kv_policy=policy)
    sync = _serve(sync_eng, _prompts(12), params)
    async_eng = _engine(kv_policy=policy, async_scheduling=True)
    assert async_eng.scheduler._async
    out = _serve(async_eng, _prompts(12), params)
    assert {k: v.token_ids for k, v in out.items()} == {k: v.token_ids for k, v in sync.items()}
    assert async_eng.scheduler.counters.num_preemptions > 0  # the pool was too small


def test_async_equals_sync_for_sampling_stops_and_logprobs():
    """Seeded random sampling, logprobs, min_tokens with EOS banned, stop strings and EOS:
    each reads its own token count, which must include the token still in flight."""
    eng = _engine(num_gpu_blocks=40)
    eos = eng.tokenizer.eos_token_ids[0]
    cases = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=3, max_tokens=20, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=12, logprobs=2, ignore_eos=True),
        SamplingParams(temperature=0.0, max_tokens=15, min_tokens=10),
        SamplingParams(temperature=0.0, max_tokens=25, stop_token_ids=[eos]),
    ]
    eng.close()
    for params in cases:
        sync = _serve(_engine(num_gpu_blocks=40), _prompts(5, 1), params)
        out = _serve(_engine(num_gpu_blocks=40, async_scheduling=True), _prompts(5, 1), params)
        for rid, c in sync.items():
            a = out[rid]
            assert (a.token_ids, a.finish_reason, a.text) == (c.token_ids, c.finish_reason, c.text)
            assert a.logprobs == c.logprobs


def test_async_with_aborts_keeps_invariants():
    params = SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True)
    finals = _serve(_engine(async_scheduling=True), _prompts(8, 2), params,
                    abort_at={3: "1", 7: "4", 20: "6"})
    assert "1" not in finals and len(finals) >= 5


def test_async_plan_decodes_placeholder_and_stops_at_max_tokens():
    eng = _engine(num_gpu_blocks=40, async_scheduling=True)
    eng.add_request("a", [7, 8, 9], SamplingParams(temperature=0.0, max_tokens=3,
                                                   ignore_eos=True))
    sched = eng.scheduler
    p1 = sched.schedule()  # the prefill: samples token 1
    req = sched.requests["a"]
    assert p1.scheduled[0].sample and req.num_pending_tokens == 1
    p2 = sched.schedule()  # before token 1 is back: decode it as a placeholder
    assert p2.scheduled[0].token_ids == [PLACEHOLDER_TOKEN]
    assert p2.scheduled[0].num_output_tokens == 1 and req.num_pending_tokens == 2
    sched.update(p1, eng.executor.execute(p1))
    assert req.num_pending_tokens == 1 and len(req.output_token_ids) == 1
    p3 = sched.schedule()  # token 2 in flight; token 3 is the last one
    assert p3.scheduled[0].token_ids == [PLACEHOLDER_TOKEN]
    eng.executor.execute(p2)
    p4 = sched.schedule()  # tokens 2 and 3 in flight: max_tokens reached, nothing more
    assert not p4.scheduled
    eng.close()


def test_async_refuses_a_reused_id_still_in_flight():
    eng = _engine(num_gpu_blocks=40, async_scheduling=True)
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    eng.add_request("a", [1, 2, 3], params)
    eng.step()  # launched, not read back
    eng.abort_request("a")
    with pytest.raises(ValueError, match="in flight"):
        eng.add_request("a", [4, 5], params)
    eng.step()  # the in-flight step is read back: the id is free again
    eng.add_request("a", [4, 5], params)
    finals = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            finals[out.request_id] = out.outputs[0].token_ids
        eng.check_integrity()
    assert len(finals["a"]) == 8
    eng.close()


def _cli(*flags: str) -> EngineArgs:
    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    return EngineArgs.from_cli_args(parser.parse_args(["tiny-llama", *flags]))


def test_async_scheduling_flag_defaults_to_the_executor():
    assert _cli().async_scheduling is None
    assert _cli("--async-scheduling").async_scheduling is True
    assert _cli("--no-async-scheduling").async_scheduling is False


def test_default_follows_the_runner_and_resolves_to_a_bool(monkeypatch):
    cpu = _engine()  # the CPU runner's host is its device: nothing to hide behind
    assert cpu.scheduler._async is False and cpu.config.scheduler.async_scheduling is False
    cpu.close()
    # A runner that prefers async (the GPU's) gets it when nothing is asked for...
    monkeypatch.setattr(ModelRunner, "async_by_default", property(lambda self: True))
    eng = _engine()
    assert eng.scheduler._async is True and eng.config.scheduler.async_scheduling is True
    eng.close()
    # ...and does not when the synchronous engine is asked for.
    eng = _engine(async_scheduling=False)
    assert eng.scheduler._async is False
    eng.close()


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_a_two_token_bad_word_is_banned_after_its_first_token(async_scheduling, monkeypatch):
    """A bad word's last token is banned only after its first, which under async scheduling
    is the token still in flight: the step waits for it (as a grammar's does), so the
    banned pair never appears, sync or async alike."""
    import kvtier.engine.llm_engine as llm_engine

    greedy = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)
    plain = _serve(_engine(), [[5, 6, 7]], greedy)["0"].token_ids
    pair = (plain[3], plain[4])
    # The word's text tokenizes to exactly this pair, whatever the tokenizer makes of it.
    monkeypatch.setattr(llm_engine, "bad_word_sequences", lambda tok, words, vocab: (pair,))
    params = SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True, bad_words=["w"])
    ids = _serve(_engine(async_scheduling=async_scheduling), [[5, 6, 7]], params)["0"].token_ids
    assert ids[:4] == plain[:4] and ids[4] != plain[4]
    assert all((a, b) != pair for a, b in zip(ids, ids[1:]))
