"""Bad and malicious input gets a clean 4xx in OpenAI's error format; the server keeps serving."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.server.conftest import MODEL, assert_engine_clean

OK_COMPLETION = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
OK_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.base_url, timeout=30) as c:
        yield c


def assert_error(resp: httpx.Response, status: int, param: str | None = None,
                 code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["type"]
    if param is not None:
        assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    return err


def post(http: httpx.Client, path: str, body: dict) -> httpx.Response:
    # json.dumps escapes lone surrogates as "\\ud800" (httpx's encoder refuses them).
    return http.post(path, content=json.dumps(body).encode(), headers={"content-type": "application/json"})


@pytest.mark.parametrize("content", [b"{", b'{"model": ', b"\xff\xfe\xfa not utf-8 \xc3\x28",
                                     b'{"prompt": "\xff"}', b"", b"[" * 100_000 + b"]" * 100_000])
def test_unparseable_bodies(http, content):
    resp = http.post("/v1/completions", content=content, headers={"content-type": "application/json"})
    assert_error(resp, 400)


@pytest.mark.parametrize("content", [b"[]", b'"prompt"', b"null", b"42"])
def test_body_not_an_object(http, content):
    resp = http.post("/v1/chat/completions", content=content, headers={"content-type": "application/json"})
    assert_error(resp, 400)


def test_wrong_content_type(http):
    resp = http.post("/v1/completions", content=b"prompt=hi", headers={"content-type": "text/plain"})
    assert_error(resp, 400)


def test_missing_fields(http):
    assert_error(post(http, "/v1/completions", {"model": MODEL}), 400, param="prompt")
    assert_error(post(http, "/v1/chat/completions", {"model": MODEL}), 400, param="messages")
    assert_error(post(http, "/v1/chat/completions", {**OK_CHAT, "messages": []}), 400, param="messages")
    assert_error(post(http, "/v1/chat/completions", {**OK_CHAT, "messages": [{"content": "x"}]}), 400)


def test_unknown_model(http):
    assert_error(post(http, "/v1/completions", {**OK_COMPLETION, "model": "gpt-9"}), 404,
                 param="model", code="model_not_found")
    assert_error(post(http, "/v1/chat/completions", {**OK_CHAT, "model": "gpt-9"}), 404,
                 code="model_not_found")


def test_prompt_over_max_model_len(http, live):
    max_len = live.engine.config.scheduler.max_model_len
    long_ids = [5] * max_len
    assert_error(post(http, "/v1/completions", {**OK_COMPLETION, "prompt": long_ids}), 400,
                 code="context_length_exceeded")
    long_text = "hello " * (4 * max_len)
    assert_error(post(http, "/v1/chat/completions",
                      {**OK_CHAT, "messages": [{"role": "user", "content": long_text}]}), 400,
                 code="context_length_exceeded")


def test_min_tokens_past_max_model_len(http, live):
    """Regression (found by the fuzzer): the engine ran past max_model_len and its step died."""
    max_len = live.engine.config.scheduler.max_model_len
    assert_error(post(http, "/v1/chat/completions", {**OK_CHAT, "max_tokens": None, "min_tokens": max_len}),
                 400, param="min_tokens", code="context_length_exceeded")
    assert http.get("/health").status_code == 200


@pytest.mark.parametrize("field,value", [
    ("max_tokens", 10**30), ("max_tokens", 10_000), ("max_tokens", -1), ("max_tokens", 0),
    ("max_tokens", True), ("max_tokens", "16"), ("max_tokens", 1.5),
    ("n", 0), ("n", -3), ("n", 10**6), ("temperature", -0.5), ("temperature", 1e308),
    ("top_p", 0), ("top_p", 1.5), ("logprobs", -1), ("logprobs", 1000), ("seed", -5),
    ("seed", 2**80), ("top_k", 0), ("top_k", -7), ("min_tokens", -1), ("min_tokens", 100),
    ("stop", ""), ("stop", [""]), ("stop", [1, 2]), ("stop_token_ids", [-1]),
    ("presence_penalty", 99.0), ("frequency_penalty", -2.5), ("best_of", 5), ("suffix", "x"),
    ("repetition_penalty", 0), ("repetition_penalty", -1.0), ("min_p", -0.1), ("min_p", 2),
    ("logit_bias", {"5": "x"}), ("logit_bias", {"five": 1}), ("logit_bias", {"-1": 1}),
    ("logit_bias", {"99999999": 1}), ("allowed_token_ids", []), ("allowed_token_ids", [-1]),
    ("allowed_token_ids", [99999999]), ("allowed_token_ids", ["a"]), ("allowed_token_ids", 5),
    ("bad_words", [1]), ("bad_words", "fox"), ("bad_words", ["\ud800"]),
    ("stream", "yes"), ("stream_options", {"include_usage": "maybe"}),
    ("stream_options", {"include_usage": True}), ("prompt", ""),
    ("prompt", []), ("prompt", [[]]), ("prompt", [-1]), ("prompt", [10**12]), ("prompt", [1, "a"]),
    ("prompt", "\ud800 lone surrogate"), ("prompt", ["ok"] * 100_000), ("prompt", {"a": 1}),
])
def test_invalid_completion_values(http, field, value):
    assert_error(post(http, "/v1/completions", {**OK_COMPLETION, field: value}), 400)


def test_stream_options_need_a_stream_as_in_vllm(http):
    """Options for a stream not asked for are a 400 naming the field; an empty object passes
    (vLLM's test is the options' truthiness)."""
    for path, body in (("/v1/completions", OK_COMPLETION), ("/v1/chat/completions", OK_CHAT)):
        bad = post(http, path, {**body, "stream_options": {"include_usage": True}})
        assert "stream" in assert_error(bad, 400, param="stream_options")["message"]
        assert post(http, path, {**body, "stream_options": {}}).status_code == 200
        assert post(http, path, {**body, "stream_options": None}).status_code == 200


@pytest.mark.parametrize("field,value", [
    ("max_completion_tokens", 10**30), ("max_tokens", -2), ("top_logprobs", 5),
    ("logprobs", "yes"), ("n", 257),
    ("messages", [{"role": "wizard", "content": "x"}]),
    ("messages", [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
    ("messages", [{"role": "user", "content": "\udfff"}]), ("messages", "hi"),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("response_format", {"type": "json_schema"}), ("response_format", {"type": "structural_tag"}),
    ("response_format", {"type": "json_schema", "json_schema": {"schema": "{}"}}),
    ("structured_outputs", {"regex": "a", "choice": ["b"]}), ("structured_outputs", {"x": 1}),
    ("guided_choice", []), ("guided_regex", "(unclosed"), ("guided_json", "{not json"),
    ("guided_grammar", "root ::= "), ("stop", ["\ud800"]),
])
def test_invalid_chat_values(http, field, value):
    assert_error(post(http, "/v1/chat/completions", {**OK_CHAT, field: value}), 400)


@pytest.mark.parametrize("field,value", [
    ("repetition_penalty", 1.0), ("repetition_penalty", 1.2), ("min_p", 0.0), ("min_p", 0.3),
    ("logit_bias", {}), ("logit_bias", {"5": 100}), ("logit_bias", {"5": 1e9}),
    ("presence_penalty", 0.0), ("presence_penalty", 1.0), ("frequency_penalty", -2.0),
    ("allowed_token_ids", [5]), ("allowed_token_ids", [7, 5, 7]), ("bad_words", []),
    ("bad_words", ["fox", " the dog", ""]),
])
def test_penalties_bias_and_min_p_are_accepted(http, field, value):
    resp = post(http, "/v1/completions", {**OK_COMPLETION, field: value})
    assert resp.status_code == 200, resp.text


def test_ten_megabyte_body(http):
    body = b'{"model": "%s", "prompt": "' % MODEL.encode() + b"a" * (10 * 2**20) + b'"}'
    assert_error(http.post("/v1/completions", content=body,
                           headers={"content-type": "application/json"}), 413)


def test_megabytes_of_prompt_under_the_body_limit(http):
    body = {"model": MODEL, "prompt": "word " * (6 * 2**20 // 5), "max_tokens": 2}
    assert_error(post(http, "/v1/completions", body), 400, code="context_length_exceeded")


def test_ten_megabyte_chunked_body(http):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"a" * 2**20
        yield b'"}'

    resp = http.post("/v1/completions", content=chunks(), headers={"content-type": "application/json"})
    assert_error(resp, 413)


def test_unknown_path_and_method(http):
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/completions"), 405)


def test_text_content_parts_are_joined_by_newlines_as_vllm_joins_them(http):
    parts = [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]
    a = post(http, "/v1/chat/completions", {**OK_CHAT, "temperature": 0,
                                            "messages": [{"role": "user", "content": parts}]})
    b = post(http, "/v1/chat/completions", {**OK_CHAT, "temperature": 0,
                                            "messages": [{"role": "user", "content": "Hel\nlo"}]})
    assert a.status_code == b.status_code == 200
    assert a.json()["usage"] == b.json()["usage"]
    assert a.json()["choices"][0]["message"] == b.json()["choices"][0]["message"]


def test_still_serving_after_bad_requests(http, live):
    for _ in range(3):
        assert post(http, "/v1/completions", {**OK_COMPLETION, "max_tokens": -1}).status_code == 400
        resp = post(http, "/v1/completions", OK_COMPLETION)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    assert http.get("/health").status_code == 200
    assert_engine_clean(live)
