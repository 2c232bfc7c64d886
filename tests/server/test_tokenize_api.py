"""vLLM's utility endpoints: /tokenize counts what a completion of the same input reports as
prompt_tokens, /detokenize inverts it, /version, /ping, and OpenAI's models.retrieve."""

from __future__ import annotations

import httpx
import openai
import pytest

from kvtier.server.app import build_app
from kvtier.server.params import encode_prompt
from tests.server.conftest import MODEL, start_server


def _post(live, path, body):
    return httpx.post(live.base_url + path, json=body, timeout=30)


def test_tokenize_counts_what_a_completion_reports(live):
    prompt = "The cache keeps what was computed"
    tok = _post(live, "/tokenize", {"model": MODEL, "prompt": prompt})
    assert tok.status_code == 200, tok.text
    body = tok.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == 256
    done = _post(live, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert done.json()["usage"]["prompt_tokens"] == body["count"]
    back = _post(live, "/detokenize", {"model": MODEL, "tokens": body["tokens"]})
    assert back.status_code == 200 and back.json()["prompt"] == prompt


def test_tokenize_messages_matches_the_chat_endpoint(live):
    messages = [{"role": "user", "content": "hello there"}]
    tok = _post(live, "/tokenize", {"messages": messages})
    assert tok.status_code == 200, tok.text
    done = _post(live, "/v1/chat/completions", {"model": MODEL, "messages": messages,
                                                 "max_tokens": 1})
    assert done.json()["usage"]["prompt_tokens"] == tok.json()["count"]
    no_header = _post(live, "/tokenize", {"messages": messages, "add_generation_prompt": False})
    assert no_header.json()["count"] < tok.json()["count"]


@pytest.mark.parametrize("path, body, status, code", [
    ("/tokenize", {"prompt": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "invalid_value"),
    ("/tokenize", {}, 400, "invalid_value"),
    ("/tokenize", {"model": "other", "prompt": "a"}, 404, "model_not_found"),
    ("/detokenize", {"tokens": [1, 10**9]}, 400, "invalid_value"),
    ("/detokenize", {"tokens": "1 2"}, 400, None),
])
def test_bad_utility_requests_get_clear_errors(live, path, body, status, code):
    r = _post(live, path, body)
    assert r.status_code == status, r.text
    if code is not None:
        assert r.json()["error"]["code"] == code


def test_version_ping_and_models_retrieve(live):
    assert httpx.get(live.base_url + "/version").json()["version"]
    for method in (httpx.get, httpx.post):
        assert method(live.base_url + "/ping").status_code == 200
    client = openai.OpenAI(base_url=live.base_url + "/v1", api_key="unused")
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_the_api_key_guards_tokenize_too(engine):
    srv = start_server(build_app(engine, api_key="sk-tok"))
    try:
        url = srv.base_url
        assert httpx.post(url + "/tokenize", json={"prompt": "a"}).status_code == 401
        ok = httpx.post(url + "/tokenize", json={"prompt": "a"},
                        headers={"Authorization": "Bearer sk-tok"})
        assert ok.status_code == 200
        assert httpx.get(url + "/ping").status_code == 200  # a probe, like /health
    finally:
        srv.stop()



class _BosTokenizer:
    """Adds a BOS as Llama's tokenizers do (the test model's has none)."""

    bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [1] * add_special_tokens + [ord(c) for c in text]


def test_add_special_tokens_is_the_tokenizers_to_apply():
    tok = _BosTokenizer()
    assert encode_prompt(tok, "hi", "prompt", True) == [1, 104, 105]
    assert encode_prompt(tok, "hi", "prompt", False) == [104, 105]


def test_completions_take_add_special_tokens(live):
    """vLLM's field reaches the prompt's encoding (the test model adds no BOS: the same
    count either way), on completions as on /tokenize."""
    with httpx.Client(base_url=live.base_url, timeout=60) as http:
        counts = {http.post("/v1/completions", json={
            "model": MODEL, "prompt": ["Hello there"] * 2, "max_tokens": 1,
            "add_special_tokens": special}).json()["usage"]["prompt_tokens"]
            for special in (True, False)}
        tokenized = http.post("/tokenize", json={"prompt": "Hello there",
                                                 "add_special_tokens": False}).json()
    assert counts == {2 * tokenized["count"]}
