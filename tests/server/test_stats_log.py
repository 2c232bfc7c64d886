"""vLLM's periodic stats line: throughput over the interval, queues, KV usage of each tier and
the interval's prefix-cache hit rate; logged while serving unless --disable-log-stats. And
each request's line under --enable-log-requests."""

from __future__ import annotations

import dataclasses
import logging
import time

import httpx
import pytest

from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.outputs import EngineStats
from kvtier.server.app import build_app
from kvtier.server.cli import logs_from_args
from kvtier.server.logs import ServerLogs
from kvtier.server.stats_log import INTERVAL_ENV, StatsLine, interval_from_env
from tests.server.conftest import MODEL, make_engine, serve_until_clean


def _stats(**kw) -> EngineStats:
    base = dict(num_running=0, num_waiting=0, num_swapped=0, gpu_blocks_used=0,
                gpu_blocks_total=100, host_blocks_used=0, host_blocks_total=0,
                num_preemptions_total=0, num_swap_out_blocks_total=0, num_swap_in_blocks_total=0,
                num_recomputed_tokens_total=0, num_prompt_tokens_total=0,
                num_generation_tokens_total=0, num_scheduled_tokens=0, block_bytes=1,
                step_time_s=0.0)
    return EngineStats(**{**base, **kw})


def test_the_line_reads_the_interval_not_the_totals():
    lines = StatsLine(_stats(num_prompt_tokens_total=1000, num_prefix_cache_queries_total=100,
                             num_prefix_cache_hits_total=100), now=0.0)
    busy = _stats(num_running=3, num_waiting=2, gpu_blocks_used=25, host_blocks_used=10,
                  host_blocks_total=40, num_prompt_tokens_total=3000,
                  num_generation_tokens_total=500, num_prefix_cache_queries_total=300,
                  num_prefix_cache_hits_total=150)
    line = lines.line(busy, now=10.0)
    assert line == ("Avg prompt throughput: 200.0 tokens/s, Avg generation throughput: 50.0 tokens/s, "
                    "Running: 3 reqs, Waiting: 2 reqs, GPU KV cache usage: 25.0%, "
                    "Prefix cache hit rate: 25.0%, Host KV cache usage: 25.0%")
    decoding = dataclasses.replace(busy, num_generation_tokens_total=900)  # no look-up since
    assert "Prefix cache hit rate: 25.0%" in lines.line(decoding, now=20.0)


def test_an_idle_engine_logs_once_then_waits_for_a_change():
    lines = StatsLine(None, now=0.0)
    assert lines.line(None, now=1.0) is None  # no step yet
    done = _stats(num_prompt_tokens_total=10, num_generation_tokens_total=5)
    assert "Avg prompt throughput: 5.0" in lines.line(done, now=2.0)
    assert "Running: 0 reqs" in lines.line(done, now=3.0)  # the idle line, once
    assert lines.line(done, now=4.0) is None
    assert lines.line(dataclasses.replace(done, num_waiting=1), now=5.0) is not None


def test_interval_from_the_environment_and_the_flag():
    assert interval_from_env({}) == 10.0
    assert interval_from_env({INTERVAL_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(ValueError, match=INTERVAL_ENV):
            interval_from_env({INTERVAL_ENV: bad})
    args = build_parser().parse_args(["serve", MODEL, "--disable-log-stats"])
    assert logs_from_args(args) == ServerLogs()
    with pytest.raises(ValueError, match="stats interval"):
        ServerLogs(stats_interval_s=0)
    with pytest.raises(ConfigError, match="--max-log-len"):
        logs_from_args(build_parser().parse_args(["serve", MODEL, "--max-log-len", "-1"]))
    quiet = build_parser().parse_args(["serve", MODEL, "--disable-log-requests"])  # vLLM's old flag
    assert not logs_from_args(quiet).requests
    with pytest.raises(ConfigError, match="contradict"):
        logs_from_args(build_parser().parse_args(["serve", MODEL, "--disable-log-requests",
                                                  "--enable-log-requests"]))


def test_the_server_logs_the_lines_while_it_serves(tiny_model_dir, caplog, monkeypatch):
    monkeypatch.setenv(INTERVAL_ENV, "x")
    with pytest.raises(ConfigError, match=INTERVAL_ENV):
        logs_from_args(build_parser().parse_args(["serve", MODEL]))
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    logs = logs_from_args(build_parser().parse_args(
        ["serve", MODEL, "--enable-log-requests", "--max-log-len", "2"]))
    assert logs == ServerLogs(stats_interval_s=0.05, requests=True, max_log_len=2)
    caplog.set_level(logging.INFO, logger="kvtier")
    for srv in serve_until_clean(build_app(make_engine(tiny_model_dir), logs=logs)):
        r = httpx.post(srv.base_url + "/v1/completions",
                       json={"model": MODEL, "prompt": "hello there", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any(
                "Avg generation throughput" in m for m in caplog.messages):
            time.sleep(0.05)
    assert any("Avg prompt throughput" in m and "GPU KV cache usage" in m for m in caplog.messages)
    received = [m for m in caplog.messages if m.startswith("Received request cmpl-")]
    assert len(received) == 1 and "max_tokens=4" in received[0]
    ids = received[0].split("prompt_token_ids: ")[1].split("]")[0]
    assert len(ids.strip("[").split(",")) == 2  # cut to --max-log-len
