"""Refusals that need no tokenizer come before it: a full queue, too many characters for
max_model_len, too much text queued for the tokenizer. Each answers within milliseconds."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server


class SlowTokenizer:
    """The real tokenizer, `delay_s` slower per encode, counting the texts it was given."""

    def __init__(self, inner, delay_s: float) -> None:
        self._inner = inner
        self.delay_s = delay_s
        self.num_encoded = 0
        self._lock = threading.Lock()

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with self._lock:
            self.num_encoded += 1
        time.sleep(self.delay_s)
        return self._inner.encode(text, add_special_tokens)


@pytest.fixture
def slow(tiny_model_dir):
    engine = make_engine(tiny_model_dir, max_num_seqs=4)
    engine.tokenizer = SlowTokenizer(engine.tokenizer, delay_s=0.2)
    srv = start_server(build_app(engine, max_waiting_requests=4, max_tokenize_queue_chars=2000))
    yield srv, engine.tokenizer
    srv.stop()


async def _timed_post(client: httpx.AsyncClient, body: dict) -> tuple[int, float, str | None]:
    t0 = time.monotonic()
    resp = await client.post("/v1/completions", json=body)
    code = resp.json()["error"]["code"] if resp.status_code != 200 else None
    return resp.status_code, time.monotonic() - t0, code


def test_a_burst_is_refused_before_the_tokenizer(slow):
    """40 at once on 4 waiting places, with a tokenizer taking 0.2 s a prompt: 36 get 503
    in milliseconds (not after the queue's 8 s), and only the 4 admitted are tokenized."""
    srv, tokenizer = slow
    body = {"model": MODEL, "prompt": "burst", "max_tokens": 2}

    async def burst() -> list[tuple[int, float, str | None]]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            return await asyncio.gather(*(_timed_post(client, body) for _ in range(40)))

    results = asyncio.run(burst())
    refused = sorted(t for status, t, code in results if status == 503 and code == "server_overloaded")
    assert sum(status == 200 for status, _, _ in results) >= 4
    assert len(refused) >= 30 and refused[len(refused) // 2] < 0.5, refused
    assert tokenizer.num_encoded <= 10
    assert_engine_clean(srv)


def test_too_many_characters_and_a_full_tokenizer_queue(slow):
    srv, tokenizer = slow
    limits = srv.app.state.server.limits
    huge = "word " * (limits.max_prompt_chars // 5 + 10)
    t0 = time.monotonic()
    resp = httpx.post(srv.base_url + "/v1/completions", json={"model": MODEL, "prompt": huge}, timeout=30)
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "context_length_exceeded"
    assert "characters" in resp.json()["error"]["message"] and time.monotonic() - t0 < 1.0
    chat = {"model": MODEL, "messages": [{"role": "user", "content": huge}]}
    assert httpx.post(srv.base_url + "/v1/chat/completions", json=chat, timeout=30).status_code == 400
    assert tokenizer.num_encoded == 0

    # 2,000 characters may wait for the tokenizer: of three 800-character prompts sent
    # together, one finds the queue full.
    body = {"model": MODEL, "prompt": "the " * 200, "max_tokens": 2}

    async def three() -> list[tuple[int, float, str | None]]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            return await asyncio.gather(*(_timed_post(client, body) for _ in range(3)))

    statuses = sorted(status for status, _, _ in asyncio.run(three()))
    assert statuses == [200, 200, 503]
    assert_engine_clean(srv)


def test_refused_before_the_body_is_read(tiny_model_dir):
    """While nothing can be admitted, a POST is answered 503 on its headers alone."""
    srv = start_server(build_app(make_engine(tiny_model_dir)))
    try:
        srv.async_engine.stop_accepting()  # as on SIGTERM
        with socket.create_connection(("127.0.0.1", srv.port), timeout=5) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 1000000\r\n\r\n")
            reply = b""
            while b"}}" not in reply:  # the JSON error body's end (bounded by the timeout)
                chunk = s.recv(65536)
                assert chunk, reply
                reply += chunk
        assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in reply.lower()
        assert b"the server is shutting down" in reply
    finally:
        srv.stop()
