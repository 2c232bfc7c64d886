"""Structured outputs through the engine (tiny dummy model, CPU): every token a sequence gets
is one its grammar allows, a sequence ends where its grammar does, and the masks change
nothing but the structured rows, through async scheduling, chunked prefill, preemption,
n > 1 and min_tokens."""

from __future__ import annotations

import json
import re

import pytest

from kvtier import LLM, SamplingParams
from kvtier.model.presets import PRESETS
from kvtier.sampling_params import InvalidRequestError

xgr = pytest.importorskip("xgrammar")

PROMPTS = ["The answer is", "Write a date:", "hello there my friend", "{"]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "ok": {"type": "boolean"}},
          "required": ["name", "ok"], "additionalProperties": False}
FORMATS = {
    "choice": {"choice": ["yes", "no way", "maybe \"so\"\n", "ça"]},
    "regex": {"regex": r"[0-9]{4}-[0-9]{2}-[0-9]{2}( [a-z]{1,3})?"},
    "grammar": {"grammar": 'root ::= "(" item ("," item)* ")"\nitem ::= [a-c] | "zz"'},
    "json": {"json": SCHEMA, "disable_any_whitespace": True},
}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """tiny-llama with a 2,048-token vocabulary (Qwen's BPE cut to fit): quick masks."""
    path = tmp_path_factory.mktemp("structured")
    (path / "config.json").write_text(json.dumps({**PRESETS["tiny-llama"], "vocab_size": 2048}))
    return str(path)


def make_llm(model_dir, **options) -> LLM:
    options = {"device": "cpu", "dtype": "float32", "max_model_len": 128,
               "load_format": "dummy", **options}
    return LLM(model_dir, **options)


def matches(kind: str, text: str) -> bool:
    if kind == "choice":
        return text in FORMATS["choice"]["choice"]
    if kind == "regex":
        return re.fullmatch(FORMATS["regex"]["regex"], text) is not None
    if kind == "grammar":
        return re.fullmatch(r"\((?:[a-c]|zz)(?:,(?:[a-c]|zz))*\)", text) is not None
    value = json.loads(text)
    return (list(value) == ["name", "ok"]  # in the schema's order and isinstance(value["ok"], bool)
            and isinstance(value["name"], str) and len(value["name"]) <= 6)


def grammar_accepts(llm: LLM, spec: dict, tokens: list[int]) -> bool:
    """A fresh matcher takes every token, and ends after the last (its stop token)."""
    grammars = llm.engine.grammars
    compiled = grammars.compile(SamplingParams(structured_outputs=spec))
    matcher = grammars.backend.matcher(compiled, llm.engine.tokenizer.eos_token_ids)
    return all(matcher.accept_token(t) for t in tokens) and matcher.is_terminated()


def run(llm: LLM, params: SamplingParams, prompts=PROMPTS):
    outs = llm.generate(prompts, params)
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    return [c for o in outs for c in o.outputs]


@pytest.mark.parametrize("kind", sorted(FORMATS))
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=7)],
                         ids=["greedy", "sampled"])
@pytest.mark.parametrize("async_scheduling", [False, True], ids=["sync", "async"])
def test_outputs_follow_the_grammar_and_end_with_it(model_dir, kind, sampling,
                                                    async_scheduling):
    llm = make_llm(model_dir, async_scheduling=async_scheduling)
    params = SamplingParams(max_tokens=60, structured_outputs=FORMATS[kind], **sampling)
    for out in run(llm, params):
        assert out.finish_reason == "stop", (kind, out.text)
        assert matches(kind, out.text), (kind, out.text)
        assert grammar_accepts(llm, FORMATS[kind], out.token_ids)


def test_masks_touch_only_the_structured_rows(model_dir):
    """Unstructured requests batched with structured ones sample what they sample alone;
    the structured ones get the tokens they get alone (greedy), chunked or not."""
    plain = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    held = SamplingParams(temperature=0.0, max_tokens=40, structured_outputs=FORMATS["regex"])
    alone_plain = [o.token_ids for o in run(make_llm(model_dir), plain)]
    alone_held = [o.token_ids for o in run(make_llm(model_dir), held)]
    for options in ({}, {"max_num_batched_tokens": 5}, {"async_scheduling": True}):
        llm = make_llm(model_dir, **options)
        outs = llm.generate(PROMPTS * 2, [plain] * len(PROMPTS) + [held] * len(PROMPTS))
        llm.engine.check_integrity()
        assert [o.outputs[0].token_ids for o in outs] == alone_plain + alone_held, options


@pytest.mark.parametrize("kv_policy", ["recompute", "swap"])
def test_preempted_sequences_resume_their_grammar(model_dir, kv_policy):
    """A small pool preempts and resumes the sequences; their grammar state is the tokens
    they hold, so the outputs are those of a pool with room."""
    params = SamplingParams(temperature=0.0, max_tokens=60,
                            structured_outputs={"regex": "[a-c]{40}"})
    want = [o.token_ids for o in run(make_llm(model_dir, max_model_len=80), params)]
    llm = make_llm(model_dir, kv_policy=kv_policy, num_gpu_blocks=24, block_size=4,
                   layers_per_block=4, max_model_len=80)
    got = run(llm, params)
    assert [o.token_ids for o in got] == want
    assert all(re.fullmatch("[a-c]{40}", o.text) for o in got)
    assert llm.engine.get_stats().num_preemptions_total > 0


def test_each_of_n_sequences_has_its_own_matcher(model_dir):
    params = SamplingParams(n=3, temperature=1.0, seed=1, max_tokens=60,
                            structured_outputs=FORMATS["grammar"])
    outs = run(make_llm(model_dir), params, PROMPTS[:1])
    assert len(outs) == 3 and len({tuple(o.token_ids) for o in outs}) > 1
    assert all(matches("grammar", o.text) and o.finish_reason == "stop" for o in outs)


def test_min_tokens_yields_to_a_grammar_that_must_end(model_dir):
    """Before min_tokens the end ids are banned where the grammar allows something else;
    once the grammar allows nothing but the end, it ends."""
    params = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=30,
                            structured_outputs=FORMATS["choice"])
    for out in run(make_llm(model_dir), params):
        assert matches("choice", out.text) and out.finish_reason == "stop"
    grammar = SamplingParams(temperature=0.0, max_tokens=40, min_tokens=8,
                             structured_outputs={"regex": "[a-c]+"})
    for out in run(make_llm(model_dir), grammar):
        assert re.fullmatch("[a-c]+", out.text) and len(out.token_ids) >= 8


@pytest.mark.parametrize("spec", [{"regex": "(unclosed"}, {"grammar": "root ::= "},
                                  {"json": "{not json"}, {"json": {"type": "no-such-type"}}])
def test_a_bad_format_is_refused_and_leaves_nothing(model_dir, spec):
    llm = make_llm(model_dir)
    with pytest.raises(InvalidRequestError, match="structured_outputs"):
        llm.engine.add_request("bad", "hello", SamplingParams(structured_outputs=spec))
    assert not llm.engine.has_unfinished_requests()
    llm.engine.check_integrity()
    assert run(llm, SamplingParams(max_tokens=4))  # the engine goes on


def test_params_check_their_shape():
    for bad in ({}, {"regex": "a", "choice": ["b"]}, {"choice": []}, {"choice": "ab"},
                {"regex": ""}, {"json": {1j: 2}}, {"colour": "red"}):
        with pytest.raises(InvalidRequestError):
            SamplingParams(structured_outputs=bad)
    a = SamplingParams(structured_outputs={"json": {"b": 1, "a": 2}})
    b = SamplingParams(structured_outputs={"json": '{"b": 1, "a": 2}'})
    assert a.structured_outputs.json == '{"b": 1, "a": 2}' and a == b  # the order kept
    assert hash(a)  # params stay hashable (the schema is kept as text)


def test_an_aborted_structured_request_leaves_nothing(model_dir):
    llm = make_llm(model_dir, async_scheduling=True)
    engine = llm.engine
    params = SamplingParams(temperature=0.0, max_tokens=60, structured_outputs=FORMATS["json"])
    engine.add_request("a", "hello", params)
    engine.add_request("b", "hello", params)
    for _ in range(4):
        engine.step()
    engine.abort_request("a")
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    assert engine.scheduler.kv.all_free()


@pytest.mark.gpu
@pytest.mark.parametrize("kind", sorted(FORMATS))
def test_on_the_gpu_outputs_follow_the_grammar(model_dir, kind):
    """The GPU path (async scheduling, graphs, pinned uploads of the masks), fp32 and bf16."""
    for dtype in ("float32", "bfloat16"):
        llm = make_llm(model_dir, device="cuda", dtype=dtype)
        params = SamplingParams(max_tokens=60, temperature=1.0, seed=3,
                                structured_outputs=FORMATS[kind])
        for out in run(llm, params):
            assert out.finish_reason == "stop" and matches(kind, out.text), (dtype, out.text)
        llm.engine.close()
