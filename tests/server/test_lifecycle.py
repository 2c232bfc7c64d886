"""Graceful shutdown (finish or abort in-flight requests, stop the worker) and a dead engine."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from kvtier.server.app import build_app
from kvtier.server.async_engine import MAX_CONSECUTIVE_STEP_FAILURES
from tests.server.conftest import MODEL, make_engine, start_server


def _body(max_tokens: int, i: int = 0) -> dict:
    return {"model": MODEL, "prompt": f"shutdown {i}", "max_tokens": max_tokens, "ignore_eos": True,
            "stream": True, "temperature": 0}


async def _stream_texts(base_url: str, bodies: list[dict], started: asyncio.Event) -> list[list[str]]:
    async def one(client: httpx.AsyncClient, body: dict) -> list[str]:
        events = []
        try:
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                async for line in resp.aiter_lines():
                    if line.startswith("data: "):
                        events.append(line[6:])
                        started.set()
        except httpx.HTTPError:
            events.append("<connection closed>")
        return events

    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        return await asyncio.gather(*(one(client, b) for b in bodies))


async def _refusing(base_url: str) -> None:
    """Returns once the server no longer accepts connections (bounded)."""
    deadline = time.monotonic() + 10
    async with httpx.AsyncClient(base_url=base_url) as client:
        while time.monotonic() < deadline:
            try:
                await client.get("/health", headers={"Connection": "close"})
            except httpx.TransportError:  # refused, or accepted and closed by the shutdown
                return
            await asyncio.sleep(0.01)
    raise AssertionError("server kept accepting connections")


def _shutdown_during(srv, bodies: list[dict]) -> list[list[str]]:
    """Start streams, SIGTERM-equivalent once they run; check they outlive the listener."""
    async def run() -> list[list[str]]:
        started = asyncio.Event()
        task = asyncio.create_task(_stream_texts(srv.base_url, bodies, started))
        await asyncio.wait_for(started.wait(), 30)
        srv.server.should_exit = True  # what SIGTERM does
        await _refusing(srv.base_url)
        assert not task.done(), "streams ended before shutdown began: make them longer"
        return await task

    results = asyncio.run(run())
    srv.thread.join(30)
    assert not srv.thread.is_alive()
    return results


def _assert_stopped_clean(srv) -> None:
    # The worker has stopped, so the engine may be inspected directly now.
    assert not srv.async_engine.is_healthy
    engine = srv.engine
    assert not engine.has_unfinished_requests()
    stats = engine.get_stats()
    assert stats.gpu_blocks_used == 0 and stats.num_running == stats.num_waiting == 0
    engine.check_integrity()


def test_graceful_shutdown_finishes_in_flight(tiny_model_dir):
    srv = start_server(build_app(make_engine(tiny_model_dir), shutdown_timeout_s=20))
    results = _shutdown_during(srv, [_body(240, i) for i in range(8)])
    for events in results:
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    with pytest.raises(httpx.ConnectError):
        httpx.get(srv.base_url + "/health")
    _assert_stopped_clean(srv)


def test_shutdown_timeout_aborts_in_flight(tiny_model_dir):
    srv = start_server(build_app(make_engine(tiny_model_dir), shutdown_timeout_s=0.5))
    t0 = time.monotonic()
    results = _shutdown_during(srv, [_body(240, i) for i in range(40)])
    assert time.monotonic() - t0 < 20
    # At least one stream was cut short: no finish reason reached its client.
    finished = [any('"finish_reason":"length"' in e for e in ev) for ev in results]
    assert not all(finished)
    _assert_stopped_clean(srv)


class ExplodingEngine:
    """The real engine, whose step() fails once `explode` is set (a bug, an OOM...)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self.explode = False

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def step(self):
        if self.explode:
            raise RuntimeError("simulated engine failure")
        return self._inner.step()


def test_dead_engine_fails_requests_and_health(tiny_model_dir):
    """A step that fails every time is a broken engine, not a bad request: after
    MAX_CONSECUTIVE_STEP_FAILURES failing steps (each ending its requests with a 500) the
    loop stops for good: 503, /health 503, engine_healthy 0."""
    engine = ExplodingEngine(make_engine(tiny_model_dir))
    srv = start_server(build_app(engine))
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            ok = http.post("/v1/completions", json={**_body(3), "stream": False})
            assert ok.status_code == 200
            engine.explode = True
            for _ in range(MAX_CONSECUTIVE_STEP_FAILURES - 1):
                failed = http.post("/v1/completions", json={**_body(3), "stream": False})
                assert failed.status_code == 500 and failed.json()["error"]["type"] == "server_error"
                assert http.get("/health").status_code == 200
            failed = http.post("/v1/completions", json={**_body(3), "stream": False})
            assert failed.status_code == 503 and failed.json()["error"]["type"] == "service_unavailable"
            assert http.get("/health").status_code == 503
            again = http.post("/v1/completions", json=_body(3))
            assert again.status_code == 503
            assert "kvtier:engine_healthy 0.0" in http.get("/metrics").text
    finally:
        srv.stop()
