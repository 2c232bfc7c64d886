"""Tool calling through the server with the official `openai` client: tools and earlier
calls through the chat template, a named function and "required" held to the tools'
schemas, "auto" read by the hermes parser, streamed and not, and the refusals vLLM makes."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, TOOL_ENGINE, make_engine, openai_client, start_server

pytest.importorskip("xgrammar")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                    "days": {"type": "integer", "minimum": 1,
                                                             "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"enum": ["UTC"]}},
                                       "required": ["zone"], "additionalProperties": False}}}
TOOLS = [WEATHER, TIME]
MESSAGES = [{"role": "user", "content": "Weather in Paris for 3 days?"}]
# "auto" reads the model's own text: a random model is made to write a hermes block.
FORCED = {"guided_regex": r'Let me check\.<tool_call>\n\{"name": "get_weather", "arguments": '
          r'\{"city": "(Paris|Rome)", "days": [1-7]\}\}\n</tool_call>'}


def check_weather_args(arguments: str) -> None:
    args = json.loads(arguments)
    assert set(args) == {"city", "days"} and args["city"] in ("Paris", "Rome")
    assert 1 <= args["days"] <= 7


def create(client, **kw):
    kw = {"model": MODEL, "messages": MESSAGES, "tools": TOOLS, "max_tokens": 120,
          "temperature": 0, **kw}
    return client.chat.completions.create(**kw)


def test_named_function(tool_client, compact):
    out = create(tool_client, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 **compact)
    choice = out.choices[0]
    assert choice.finish_reason == "stop" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    check_weather_args(call.function.arguments)


@pytest.mark.parametrize("parallel", [True, False])
def test_required(tool_client, compact, parallel):
    out = create(tool_client, tool_choice="required", parallel_tool_calls=parallel, temperature=1.0,
                 seed=4, max_tokens=200, **compact)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    calls = choice.message.tool_calls
    assert calls and (parallel or len(calls) == 1)
    for call in calls:
        assert call.function.name in ("get_weather", "get_time")
        if call.function.name == "get_weather":
            check_weather_args(call.function.arguments)
        else:
            assert json.loads(call.function.arguments) == {"zone": "UTC"}


def test_auto_reads_the_models_calls(tool_client):
    out = create(tool_client, extra_body=FORCED)
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "Let me check."
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    check_weather_args(call.function.arguments)


def test_auto_without_a_call_is_text(tool_client):
    out = create(tool_client, max_tokens=8, extra_body={"ignore_eos": True})
    choice = out.choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls == []
    assert isinstance(choice.message.content, str)


@pytest.mark.parametrize("kw", [
    {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
    {"tool_choice": "required"},
    {"extra_body": FORCED},
], ids=["named", "required", "auto"])
def test_streamed_calls_equal_unstreamed(tool_client, compact, kw):
    kw = {**compact, **kw}
    whole = create(tool_client, **kw).choices[0]
    chunks = list(create(tool_client, stream=True, **kw))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls: dict[int, dict] = {}
    for c in chunks:
        for d in (c.choices[0].delta.tool_calls or []) if c.choices else []:
            entry = calls.setdefault(d.index, {"name": "", "arguments": "", "id": None})
            entry["id"] = entry["id"] or d.id
            entry["name"] += d.function.name or ""
            entry["arguments"] += d.function.arguments or ""
    assert content == (whole.message.content or "")
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        (t.function.name, t.function.arguments) for t in whole.message.tool_calls]
    assert all(c["id"] for c in calls.values())
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.finish_reason


def test_earlier_calls_and_tool_answers_go_to_the_template(tool_server, tool_client):
    messages = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    out = create(tool_client, messages=messages, max_tokens=4, extra_body={"ignore_eos": True})
    tokenizer = tool_server.engine.tokenizer
    as_template = [dict(m) for m in messages]
    as_template[1] = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}}]}
    ids = tokenizer.apply_chat_template(as_template, tools=TOOLS)
    assert out.usage.prompt_tokens == len(ids)
    counted = httpx.post(tool_server.base_url + "/tokenize", json={"messages": messages, "tools": TOOLS})
    assert counted.json()["count"] == len(ids)  # /tokenize renders the tools the same
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in text
    assert '"name": "get_weather", "arguments": {"city": "Paris", "days": 3}' in text
    assert '"description": "The weather in a city."' in text


@pytest.mark.parametrize("kw,match", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "not among the tools"),
    ({"tools": None, "tool_choice": "required"}, "needs tools"),
    ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
])
def test_refusals(tool_client, kw, match):
    with pytest.raises(openai.BadRequestError, match=match):
        create(tool_client, **kw)


def test_auto_needs_the_servers_parser(tiny_model_dir):
    srv = start_server(build_app(make_engine(tiny_model_dir, **TOOL_ENGINE)))
    try:
        with openai_client(srv) as c:
            with pytest.raises(openai.BadRequestError, match="enable-auto-tool-choice"):
                create(c)
            out = create(c, tool_choice="none", max_tokens=3, extra_body={"ignore_eos": True})
            assert out.choices[0].message.tool_calls == []
    finally:
        srv.stop()
