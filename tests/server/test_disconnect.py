"""Clients that drop mid-request leave no running request and no used block behind."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from kvtier.policies import policy_names
from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

LONG = 200  # tokens: far more than a client waits for before dropping


@pytest.fixture(scope="module", params=[*((p, False) for p in policy_names()),
                                        ("recompute", True), ("swap", True)],
                ids=lambda p: p[0] + ("-async" if p[1] else ""))
def live(request, tiny_model_dir):
    """Per KV policy, on 32 blocks: too few for the requests below, so some of the aborted
    requests are preempted ones (swapped out to host memory under `swap`). Async scheduling
    too: an aborted request may still have a step in flight."""
    policy, async_scheduling = request.param
    srv = start_server(build_app(make_engine(tiny_model_dir, kv_policy=policy, num_gpu_blocks=32,
                                             async_scheduling=async_scheduling)))
    yield srv
    srv.stop()


def _aborted_total(base_url: str) -> float:
    for line in httpx.get(base_url + "/metrics").text.splitlines():
        if line.startswith("kvtier:request_client_aborted_total"):
            return float(line.split()[-1])
    raise AssertionError("abort counter missing")


def _body(i: int, stream: bool) -> dict:
    return {"model": MODEL, "prompt": f"disconnect {i}", "max_tokens": LONG, "stream": stream,
            "ignore_eos": True, "temperature": 0}


async def _drop_mid_stream(client: httpx.AsyncClient, i: int, after: int) -> None:
    async with client.stream("POST", "/v1/completions", json=_body(i, True)) as resp:
        assert resp.status_code == 200
        num_chunks = 0
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"] is not None:
                num_chunks += 1
            if num_chunks >= after:
                return  # leaving the context closes the connection mid-stream


async def _drop_unstreamed(client: httpx.AsyncClient, i: int) -> None:
    try:
        await client.post("/v1/completions", json=_body(i, False), timeout=0.3)
    except httpx.TimeoutException:
        return
    raise AssertionError("the request finished before the client gave up; make it longer")


async def _drop_all(base_url: str, n_stream: int, n_plain: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        # Dropping after 1..121 tokens: meanwhile the requests want more than 32 blocks.
        await asyncio.gather(*(_drop_mid_stream(client, i, 1 + 8 * i) for i in range(n_stream)),
                             *(_drop_unstreamed(client, 100 + i) for i in range(n_plain)))


def test_disconnect_frees_everything(live):
    before = _aborted_total(live.base_url)
    tokens_before = live.call(lambda e: e.get_stats()).num_generation_tokens_total
    asyncio.run(_drop_all(live.base_url, n_stream=16, n_plain=4))
    # Bounded wait for the aborts to reach the engine; without them the requests would
    # keep running for LONG tokens each (seconds), far past this check.
    t0 = time.monotonic()
    assert_engine_clean(live)
    assert time.monotonic() - t0 < 5
    assert _aborted_total(live.base_url) - before == 20
    stats = live.call(lambda e: e.get_stats())
    assert stats.num_generation_tokens_total - tokens_before < 20 * LONG / 2
    # Some aborted requests were preempted ones (or, for the host-resident systems, ran from
    # the host pool; for eLLM, had device KV dropped, which spares the preemption).
    relieved = live.call(lambda e: getattr(e.scheduler.policy, "num_moved_out", 0)
                         + getattr(e.scheduler.policy, "num_dropped_blocks", 0))
    assert stats.num_preemptions_total + relieved > 0


def test_disconnect_while_waiting(live):
    """A client that leaves before its request produced anything also frees it."""
    before = _aborted_total(live.base_url)

    async def run() -> None:
        async with httpx.AsyncClient(base_url=live.base_url, timeout=30) as client:
            tasks = [asyncio.create_task(client.post("/v1/completions", json=_body(i, s)))
                     for i, s in enumerate([True, False] * 4)]
            await asyncio.sleep(0.05)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(run())
    assert_engine_clean(live)
    assert _aborted_total(live.base_url) - before >= 1
