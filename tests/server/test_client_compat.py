"""What clients other than ours notice, answered as vLLM's OpenAI server answers: the official
client (sync and async), raw JSON as LangChain or LiteLLM send it, and `vllm bench serve`'s
request shapes (streamed, `stream_options.include_usage`, `ignore_eos`, chat content as a
list of text parts). tests/server/test_openai_client.py has the basics."""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from kvtier.server import api_models
from kvtier.server.app import build_app
from tests.server.conftest import MODEL, make_engine, serve_until_clean

KEY = "sk-compat"
PROMPT = "The quick brown fox jumps over the lazy dog"
# vllm bench serve's openai-chat backend sends the prompt as a list of text parts.
MESSAGES = [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]
BENCH = {"model": MODEL, "temperature": 0.0, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True}}


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    app = build_app(make_engine(tiny_model_dir), api_key=KEY, request_id_headers=True)
    yield from serve_until_clean(app)


@pytest.fixture(scope="module")
def client(server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key=KEY, max_retries=0) as c:
        yield c


@pytest.fixture(scope="module")
def http(server):
    with httpx.Client(base_url=server.base_url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as c:
        yield c


def events(resp: httpx.Response) -> list[dict]:
    assert resp.status_code == 200, resp.text
    assert resp.headers["content-type"].startswith("text/event-stream")
    lines = [line.removeprefix("data: ") for line in resp.text.splitlines() if line]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


class _TickingClock:
    """A clock a second later at every read."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def time(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "logprobs": None}),
    ("/v1/chat/completions", {"messages": MESSAGES, "max_completion_tokens": 6}),
])
def test_a_stream_stamps_one_id_and_created(http, monkeypatch, path, body):
    """vLLM (and OpenAI) stamp every chunk of a stream with the same `created`; a chunk that
    read the clock itself would tell the chunks apart once a stream spans a second. Here every
    read of the response models' clock is a second later."""
    monkeypatch.setattr(api_models, "time", _TickingClock())
    chunks = events(http.post(path, json={**BENCH, **body}))
    assert len({c["created"] for c in chunks}) == 1 and len({c["id"] for c in chunks}) == 1
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6


def test_chat_chunks_name_the_role_once(http):
    """vLLM's chunks: the first delta is {"role": "assistant", "content": ""}, later ones carry
    no role key (a null one reads as "no role" to clients that test for the key)."""
    chunks = events(http.post("/v1/chat/completions",
                              json={**BENCH, "messages": MESSAGES, "max_tokens": 4, "n": 2}))
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    first = [c for c in choices if "role" in c["delta"]]
    assert [(c["index"], c["delta"]) for c in first] == [
        (0, {"role": "assistant", "content": ""}), (1, {"role": "assistant", "content": ""})]
    assert all(c["logprobs"] is None for c in choices)  # present, as vLLM's
    assert sorted(c["index"] for c in choices if c["finish_reason"] == "length") == [0, 1]


def test_models_carry_vllms_fields(http, server):
    card = http.get("/v1/models").json()["data"][0]
    assert card["id"] == MODEL and card["object"] == "model" and card["max_model_len"] == 256
    assert card["root"] == server.engine.config.model  # the model loaded, as vLLM's root
    assert card["parent"] is None
    assert [p["object"] for p in card["permission"]] == ["model_permission"]


def test_an_empty_model_name_is_the_served_model(client):
    """vLLM takes `"model": ""` as no model named (the served one)."""
    out = client.completions.create(model="", prompt=PROMPT, max_tokens=2)
    assert out.model == MODEL and out.usage.completion_tokens == 2


def test_null_max_tokens_fills_the_context_on_completions(http):
    """vLLM's get_max_tokens reads `"max_tokens": null` as the context's limit (a field left
    out is the default, 16)."""
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": None, "ignore_eos": True}
    usage = http.post("/v1/completions", json=body).json()["usage"]
    assert usage["completion_tokens"] > 16
    del body["max_tokens"]
    assert http.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 16


def test_echo_with_max_tokens_zero_returns_the_prompt_alone(client, server):
    """vLLM's (and the legacy OpenAI API's) scoring request: `echo` with `max_tokens: 0` is the
    prompt, and with `logprobs` its tokens' logprobs, nothing generated; 0 without echo is a
    400."""
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=0, echo=True, logprobs=1)
    choice = client.completions.create(**kw).choices[0]
    assert choice.text == PROMPT
    lp = choice.logprobs
    assert len(lp.tokens) == len(server.engine.tokenizer.encode(PROMPT))
    assert lp.token_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:])
    streamed = [c.choices[0] for c in client.completions.create(stream=True, **kw) if c.choices]
    assert "".join(c.text for c in streamed) == PROMPT
    assert sum(len(c.logprobs.tokens) for c in streamed) == len(lp.tokens)
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=0)
    assert err.value.body["param"] == "max_tokens"


def test_x_request_id_names_the_response(client, server):
    """vLLM's: a client's X-Request-Id becomes the id (`cmpl-<id>`, `chatcmpl-<id>`), else
    the body's `request_id`; with --enable-request-id-headers the response header echoes it
    (a new one when the client sent none). Two calls with the same id both run."""
    headers = {"X-Request-Id": "trace-7"}
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, extra_headers=headers)
    assert raw.headers["x-request-id"] == "trace-7" and raw.parse().id == "cmpl-trace-7"
    with ThreadPoolExecutor(2) as pool:
        outs = list(pool.map(lambda _: client.chat.completions.create(
            model=MODEL, messages=MESSAGES, max_tokens=8, extra_headers=headers), range(2)))
    assert [o.id for o in outs] == ["chatcmpl-trace-7"] * 2
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=2,
                                                 stream=True, extra_headers=headers))
    assert {c.id for c in chunks} == {"chatcmpl-trace-7"}
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=PROMPT, max_tokens=2, extra_body={"request_id": "body-1"})
    assert raw.parse().id == "cmpl-body-1" and len(raw.headers["x-request-id"]) == 32
    assert httpx.get(server.base_url + "/health").headers["x-request-id"]


def test_errors_as_the_client_raises_them(client, server):
    with openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0) as bad:
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
    with pytest.raises(openai.NotFoundError, match="The model `gpt-4` does not exist."):
        client.chat.completions.create(model="gpt-4", messages=MESSAGES, max_tokens=2)
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=100_000)


def test_stop_as_a_string_or_a_list(client):
    base = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    stop = base[6:9]
    if len(base) < 9 or not stop.strip():
        pytest.skip("greedy text too short or blank to cut at")
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    one, listed = (client.completions.create(stop=s, **kw).choices[0] for s in (stop, [stop]))
    assert one.text == listed.text == base[: base.index(stop)]
    assert one.finish_reason == listed.finish_reason == "stop" and one.stop_reason == stop


def test_async_client_streams_n_choices(server):
    async def run() -> list:
        async with openai.AsyncOpenAI(base_url=server.base_url + "/v1", api_key=KEY,
                                      max_retries=0) as c:
            stream = await c.chat.completions.create(
                model=MODEL, messages=MESSAGES, max_completion_tokens=5, n=2, stream=True,
                stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
            return [chunk async for chunk in stream]

    chunks = asyncio.run(run())
    finished = sorted(c.choices[0].index for c in chunks if c.choices and c.choices[0].finish_reason)
    assert finished == [0, 1] and chunks[-1].usage.completion_tokens == 10


def test_a_client_that_leaves_mid_stream_frees_its_request(client, server):
    stream = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=200, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    stats = server.wait_idle()
    assert stats.num_running == stats.num_waiting == 0 and stats.gpu_blocks_used == 0
