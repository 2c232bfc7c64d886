"""Clients that drop while their prefix loads from the host tier leave nothing behind: no
running request, no used block in either tier's accounting, the tiers' integrity intact,
and a later request over the same prefix still gets the tokens it got before the drops."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

# 20 blocks of 16 tokens: PREFIX (125 tokens) and OTHER (229) do not fit together, so OTHER
# evicts PREFIX's last blocks to the host tier and the dropped requests load them back.
PREFIX = " ".join(f"w{i}" for i in range(45))
OTHER = " ".join(f"x{i}" for i in range(80))


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def live(request, tiny_model_dir):
    """Async scheduling too: a dropped request may have a step, and its loads, in flight."""
    srv = start_server(build_app(make_engine(
        tiny_model_dir, num_gpu_blocks=20, kv_offloading_size=0.01, hicache_min_load_blocks=1,
        async_scheduling=request.param)))
    yield srv
    srv.stop()


def _body(prompt: str, stream: bool, max_tokens: int = 8) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True, "temperature": 0}


async def _drop_after_first_token(client: httpx.AsyncClient, i: int) -> None:
    async with client.stream("POST", "/v1/completions",
                             json=_body(f"{PREFIX} q{i}", True, 100)) as resp:
        assert resp.status_code == 200
        async for line in resp.aiter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"][0]["text"]:
                return  # closes the connection mid-stream


async def _drop_all(base_url: str, n: int) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        await asyncio.gather(*(_drop_after_first_token(client, i) for i in range(n)))


def _complete(srv, prompt: str) -> str:
    resp = httpx.post(srv.base_url + "/v1/completions", json=_body(prompt, False), timeout=60)
    assert resp.status_code == 200, resp.text
    return resp.json()["choices"][0]["text"]


def test_drops_during_host_loads_free_everything_and_stay_exact(live):
    first = _complete(live, PREFIX)
    _complete(live, OTHER)  # the prefix's device blocks go to the host tier
    asyncio.run(_drop_all(live.base_url, n=8))
    tier = live.call(lambda e: e.get_stats().host_tier)
    assert tier.host_hit_tokens > 0 and tier.loaded_bytes > 0  # the drops' prefix loaded
    assert_engine_clean(live)
    _complete(live, OTHER)
    assert _complete(live, PREFIX) == first
    assert_engine_clean(live)
