"""OpenAI's Responses API through the official client: text, instructions, conversations
with earlier calls, function tools, text.format, and the typed event stream the client's
own stream helper accumulates."""

from __future__ import annotations

import json

import openai
import pytest

from tests.server.conftest import MODEL

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}}


def test_text_equals_chat(tool_client):
    out = tool_client.responses.create(model=MODEL, input="Hello there", instructions="Be terse.",
                                  max_output_tokens=8, temperature=0)
    assert out.object == "response" and out.status == "incomplete"
    assert out.incomplete_details.reason == "max_output_tokens"
    assert out.usage.output_tokens == 8 and out.usage.input_tokens > 0
    chat = tool_client.chat.completions.create(
        model=MODEL, max_tokens=8, temperature=0,
        messages=[{"role": "system", "content": "Be terse."},
                  {"role": "user", "content": "Hello there"}])
    assert out.output_text == chat.choices[0].message.content
    assert out.output[0].type == "message" and out.output[0].role == "assistant"


def test_streamed_text_equals_whole(tool_client):
    """Cut by max_output_tokens, the stream ends with response.incomplete, as OpenAI's does."""
    kw = dict(model=MODEL, input="Hello there", max_output_tokens=12, temperature=0)
    whole = tool_client.responses.create(**kw)
    events = list(tool_client.responses.create(stream=True, **kw))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.incomplete"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == whole.output_text
    assert events[-1].response.output[0].content[0].text == whole.output_text
    assert events[-1].response.usage.output_tokens == 12


def test_named_function_and_a_follow_up_turn(tool_client, compact):
    out = tool_client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER],
                                  tool_choice={"type": "function", "name": "get_weather"},
                                  max_output_tokens=200, temperature=0, extra_body=compact)
    (call,) = [o for o in out.output if o.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments)["city"] in ("Paris", "Rome")
    follow = tool_client.responses.create(
        model=MODEL, tools=[WEATHER], tool_choice="none", max_output_tokens=4, temperature=0,
        input=[{"role": "user", "content": "Weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}])
    assert follow.output[0].type == "message" and follow.usage.input_tokens > out.usage.input_tokens


def test_streamed_function_call(tool_client, compact):
    kw = dict(model=MODEL, input="Weather?", tools=[WEATHER], tool_choice="required",
              parallel_tool_calls=False, max_output_tokens=200, temperature=0,
              extra_body=compact)
    whole = [o for o in tool_client.responses.create(**kw).output if o.type == "function_call"]
    with tool_client.responses.stream(**kw) as stream:
        final = stream.get_final_response()
    streamed = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in streamed] == [(c.name, c.arguments) for c in whole]
    assert whole and all(c.status == "completed" for c in streamed)


def test_text_format_json_schema(tool_client, compact):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    kw = dict(model=MODEL, input="Is it ok?", max_output_tokens=200, temperature=0,
              extra_body=compact, text={"format": {"type": "json_schema", "name": "answer",
                                                   "schema": schema, "strict": True}})
    out = tool_client.responses.create(**kw)
    assert out.status == "completed"
    assert set(json.loads(out.output_text)) == {"ok"}
    with tool_client.responses.stream(**kw) as stream:  # the client's own accumulation
        final = stream.get_final_response()
    assert final.output_text == out.output_text


@pytest.mark.parametrize("kw,param", [
    ({"previous_response_id": "resp_1"}, "previous_response_id"),
    ({"tools": [{"type": "web_search"}]}, "tools.0"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "input.0.0"),
    ({"input": [{"type": "computer_call"}]}, "input.0"),
])
def test_refusals_name_the_field(tool_client, kw, param):
    kw = {"model": MODEL, "input": "hi", **kw}
    with pytest.raises(openai.BadRequestError) as err:
        tool_client.responses.create(**kw)
    assert err.value.body["param"] == param
