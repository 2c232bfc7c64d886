"""Structured outputs through the server, with the official `openai` client: OpenAI's
response_format (json_object, json_schema), vLLM's structured_outputs and guided_* fields
and SGLang's regex / ebnf, streamed and not, under sync and async scheduling."""

from __future__ import annotations

import json
import re

import openai
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import (
    MODEL,
    make_engine,
    openai_client,
    serve_until_clean,
)

pytest.importorskip("xgrammar")

MESSAGES = [{"role": "user", "content": "Describe a cat as JSON."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 5},
                                           "age": {"type": "integer", "minimum": 0,
                                                   "maximum": 30}},
          "required": ["name", "age"], "additionalProperties": False}
CHOICES = ["red", "green", "dark blue"]
DATE = r"[0-9]{4}-[0-9]{2}-[0-9]{2}"


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def live(request, tiny_model_dir):
    yield from serve_until_clean(build_app(make_engine(tiny_model_dir, async_scheduling=request.param)))


@pytest.fixture(scope="module")
def client(live):
    with openai_client(live) as c:
        yield c


def grammar_takes(live, spec: dict, token_ids: list[int]) -> bool:
    """A fresh matcher of the engine's takes every token and is then done."""
    grammars = live.engine.grammars
    from kvtier.sampling_params import SamplingParams

    compiled = grammars.compile(SamplingParams(structured_outputs=spec))
    matcher = grammars.backend.matcher(compiled, live.engine.tokenizer.eos_token_ids)
    return all(matcher.accept_token(t) for t in token_ids) and matcher.is_terminated()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chat_json_schema(live, client, seed):
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=200, temperature=1.0, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "cat", "schema": SCHEMA, "strict": True}},
        extra_body={"return_token_ids": True})
    choice = out.choices[0]
    ids = choice.model_extra.get("token_ids") or []
    assert choice.finish_reason == "stop"
    # strict=False: xgrammar's length-bounded strings (maxLength) admit raw control
    # characters, which a random model writes and strict JSON refuses.
    value = json.loads(choice.message.content, strict=False)
    assert set(value) == {"name", "age"} and 0 <= value["age"] <= 30
    assert grammar_takes(live, {"json": SCHEMA}, ids)


def test_chat_json_object_compact(client):
    """vLLM's structured_outputs with disable_any_whitespace: the object is closed quickly."""
    out = client.chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=120, temperature=0,
        extra_body={"structured_outputs": {"json": SCHEMA, "disable_any_whitespace": True}})
    assert out.choices[0].finish_reason == "stop"
    value = json.loads(out.choices[0].message.content, strict=False)
    assert set(value) == {"name", "age"}


@pytest.mark.parametrize("extra,check", [
    ({"guided_choice": CHOICES}, lambda t: t in CHOICES),
    ({"structured_outputs": {"choice": CHOICES}}, lambda t: t in CHOICES),
    ({"guided_regex": DATE}, lambda t: re.fullmatch(DATE, t)),
    ({"regex": DATE}, lambda t: re.fullmatch(DATE, t)),
    ({"ebnf": 'root ::= "x" [0-9] "y"'}, lambda t: re.fullmatch("x[0-9]y", t)),
    ({"guided_grammar": 'root ::= "x" [0-9] "y"'}, lambda t: re.fullmatch("x[0-9]y", t)),
], ids=["guided_choice", "structured_outputs", "guided_regex", "sglang_regex", "sglang_ebnf",
        "guided_grammar"])
def test_completion_formats(client, extra, check):
    out = client.completions.create(model=MODEL, prompt="My answer:", max_tokens=40, n=3,
                                    temperature=1.0, seed=5, extra_body=extra)
    for choice in out.choices:
        assert choice.finish_reason == "stop" and check(choice.text), choice.text


def test_streamed_choice_equals_unstreamed(client):
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=40, temperature=0,
              extra_body={"guided_choice": CHOICES})
    whole = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole and whole in CHOICES


def test_two_formats_at_once_are_refused(client):
    with pytest.raises(openai.BadRequestError, match="at most one output format"):
        client.completions.create(model=MODEL, prompt="x", max_tokens=4,
                                  extra_body={"guided_regex": "a", "guided_choice": ["b"]})


def test_a_bad_schema_is_a_400_and_the_server_goes_on(client):
    with pytest.raises(openai.BadRequestError, match="structured_outputs"):
        client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=4,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"type": "wat"}}})
    out = client.completions.create(model=MODEL, prompt="x", max_tokens=3,
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length"
