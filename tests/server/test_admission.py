"""API keys, and back-pressure: a full waiting queue answers 503 with Retry-After."""

from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

KEY = "sk-test-123"


@pytest.fixture(scope="module")
def keyed(engine):
    srv = start_server(build_app(engine, api_key=KEY))
    yield srv
    srv.stop()


def test_api_key_required(keyed):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=keyed.base_url) as http:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}):
            resp = http.post("/v1/completions", json=body, headers=headers)
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == "invalid_api_key"
        assert http.get("/v1/models").status_code == 401
        assert http.get("/health").status_code == 200  # probes need no key
        assert http.get("/metrics").status_code == 200
    with openai.OpenAI(base_url=keyed.base_url + "/v1", api_key=KEY, max_retries=0) as client:
        assert client.completions.create(**body).usage.completion_tokens >= 1
    with openai.OpenAI(base_url=keyed.base_url + "/v1", api_key="nope", max_retries=0) as client:
        with pytest.raises(openai.AuthenticationError):
            client.models.list()


def _pending(base_url: str) -> float:
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith("kvtier:num_requests_pending "):
            return float(line.split()[-1])
    raise AssertionError("no pending gauge")


def test_full_waiting_queue_gets_503(tiny_model_dir):
    """One running slot (max_num_seqs=1), two waiting places: the fourth request is refused."""
    srv = start_server(build_app(make_engine(tiny_model_dir, max_num_seqs=1), max_waiting_requests=2))
    body = {"model": MODEL, "prompt": "long one", "max_tokens": 200, "ignore_eos": True, "stream": True}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            async with client.stream("POST", "/v1/completions", json=body) as running:
                lines = running.aiter_lines()
                while not (await lines.__anext__()).startswith("data: "):
                    pass  # the first token: this request runs, it no longer waits
                waiting = [asyncio.create_task(client.post("/v1/completions", json=body)) for _ in range(2)]
                deadline = time.monotonic() + 10
                while _pending(srv.base_url) < 2:
                    assert time.monotonic() < deadline, "waiting requests never arrived"
                    await asyncio.sleep(0.01)
                refused = await client.post("/v1/completions", json={**body, "stream": False})
                assert refused.status_code == 503
                assert refused.headers["retry-after"] == "1"
                err = refused.json()["error"]
                assert err["code"] == "server_overloaded" and err["type"] == "service_unavailable"
                for task in waiting:
                    task.cancel()
                await asyncio.gather(*waiting, return_exceptions=True)

    try:
        asyncio.run(scenario())
        assert_engine_clean(srv)
        # Once the queue has drained, requests are admitted again.
        resp = httpx.post(srv.base_url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2})
        assert resp.status_code == 200
        metrics = httpx.get(srv.base_url + "/metrics").text
        assert "kvtier:request_rejected_total 1.0" in metrics
    finally:
        srv.stop()
