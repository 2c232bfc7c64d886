"""SGLang's information endpoints (/get_model_info, /get_server_info and their new names) and
/health_generate: the fields SGLang's tools read, and a probe that tells a hung engine from
a busy one."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import httpx
import pytest

from kvtier.server.app import build_app
from kvtier.server.async_engine import ServerOverloadedError
from kvtier.server.sglang_info import health_generate
from tests.server.conftest import assert_engine_clean, start_server

KEY = "sglang-key"


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.base_url, timeout=60) as c:
        yield c


def test_model_info_under_both_names(live, http):
    info = http.get("/get_model_info").json()
    assert http.get("/model_info").json() == info
    config = live.engine.config
    assert info["model_path"] == config.model and info["is_generation"] is True
    assert info["architectures"] == [config.model_config.architecture]
    assert info["model_type"] == "llama"


def test_server_info_reads_as_sglang_bench_serving_reads_it(live, http):
    http.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 2}})
    info = http.get("/get_server_info").json()
    assert http.get("/server_info").status_code == 200
    config, stats = live.engine.config, live.wait_idle()
    assert info["context_length"] == config.scheduler.max_model_len
    assert info["max_running_requests"] == config.scheduler.max_num_seqs
    assert info["page_size"] == config.cache.block_size
    assert info["max_total_num_tokens"] == stats.gpu_blocks_total * config.cache.block_size
    assert info["disable_radix_cache"] is not config.cache.enable_prefix_caching
    state = info["internal_states"][0]  # what sglang.bench_serving indexes after a run
    assert state.get("avg_spec_accept_length") is None  # no speculative decoding here
    assert state["token_capacity"] == info["max_total_num_tokens"]


def test_health_generate_runs_a_probe_and_leaves_nothing_behind(live, http):
    before = live.wait_idle().num_generation_tokens_total
    resp = http.get("/health_generate")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}
    assert live.wait_idle().num_generation_tokens_total == before + 1  # it really generated
    assert_engine_clean(live)


def test_info_needs_the_key_where_one_is_set(engine):
    srv = start_server(build_app(engine, api_key=KEY))
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as c:
            for path in ("/get_model_info", "/model_info", "/get_server_info", "/server_info"):
                assert c.get(path).status_code == 401, path
                assert c.get(path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
            assert c.get("/health_generate").status_code == 200  # a probe, as /health
    finally:
        srv.stop()


# ---- the probe's verdicts, on a stand-in engine (a real one cannot be made to hang) -----

class _Stream:
    def __init__(self, finishes: bool) -> None:
        self.finishes, self.closed = finishes, False

    async def __aiter__(self):
        if not self.finishes:
            await asyncio.sleep(3600)
        yield object()

    def close(self) -> int:
        self.closed = True
        return 0


class _Engine:
    def __init__(self, stream: _Stream | None = None, steps: bool = False,
                 healthy: bool = True) -> None:
        self.stream, self.steps, self.is_healthy = stream, steps, healthy
        self.stats = object()

    def now(self) -> float:
        return time.monotonic()

    async def submit(self, prompts, params, arrival_time):
        if self.stream is None:
            if self.steps:  # a full queue that still moves: a step lands soon
                asyncio.get_running_loop().call_later(0.1, setattr, self, "stats", object())
            raise ServerOverloadedError("full")
        return self.stream


def _verdict(engine: _Engine) -> int:
    state = SimpleNamespace(async_engine=engine, new_request_id=lambda p: f"{p}-1",
                            engine=SimpleNamespace(config=SimpleNamespace(
                                model_config=SimpleNamespace(bos_token_id=1))))
    return asyncio.run(health_generate(state, timeout_s=0.5)).status_code


def test_a_hung_engine_fails_the_probe_and_the_probe_is_aborted():
    stream = _Stream(finishes=False)
    assert _verdict(_Engine(stream)) == 503
    assert stream.closed
    assert _verdict(_Engine(_Stream(finishes=True))) == 200


def test_a_full_queue_passes_while_steps_land_and_fails_when_none_does():
    assert _verdict(_Engine(steps=True)) == 200
    assert _verdict(_Engine(steps=False)) == 503


def test_a_dead_engine_fails_at_once():
    t0 = time.monotonic()
    assert _verdict(_Engine(_Stream(finishes=True), healthy=False)) == 503
    assert time.monotonic() - t0 < 0.4
