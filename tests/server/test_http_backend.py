"""The bench harness drives the server over HTTP with the same workloads (kvtier/bench)."""

from __future__ import annotations

import time

import httpx

from kvtier.bench.http_backend import HTTPBackend
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.server.metrics import stats_from_metrics
from tests.server.conftest import MODEL, assert_engine_clean


def test_metrics_describe_engine_stats(live):
    assert_engine_clean(live)
    scraped = stats_from_metrics(httpx.get(live.base_url + "/metrics").text)
    assert scraped == live.call(lambda e: e.get_stats())


def test_run_workload_over_http(live):
    requests = [BenchRequest(tuple(range(10 + i, 30 + 2 * i)), output_len=4 + i % 5, arrival_s=0.02 * i)
                for i in range(24)]
    backend = HTTPBackend(live.base_url)
    try:
        result = run_workload(backend, requests, RunOptions(progress=False, id_prefix="http"))
    finally:
        backend.close()
    assert len(result.records) == len(requests)
    for record, request in zip(result.records, requests):
        assert record.ok, record
        assert record.prompt_len == request.prompt_len
        assert record.output_len == request.output_len  # one stamp per token
        assert 0 <= record.ttft_s <= record.e2e_s
        assert list(record.token_times_s) == sorted(record.token_times_s)
    assert result.baseline is not None and result.steps
    generated = result.counter_delta("num_generation_tokens_total")
    assert generated == sum(r.output_len for r in requests)
    assert_engine_clean(live)


def test_abort_over_http(live):
    backend = HTTPBackend(live.base_url, model=MODEL)
    try:
        backend.submit("long", BenchRequest((5, 6, 7), output_len=240), time.monotonic())
        backend.submit("short", BenchRequest((5, 6, 7), output_len=2), time.monotonic())
        records = {}
        deadline = time.monotonic() + 30
        while "short" not in records and time.monotonic() < deadline:
            records.update({r.request_id: r for r in backend.poll(0.05)})
        backend.abort(["long"])
        while "long" not in records and time.monotonic() < deadline:
            records.update({r.request_id: r for r in backend.poll(0.05)})
        assert records["short"].ok and records["short"].output_len == 2
        assert records["long"].finish_reason == "abort" and records["long"].output_len < 240
        assert backend.num_unfinished() == 0
    finally:
        backend.close()
    assert_engine_clean(live)


def test_rejected_request_is_an_error_record(live):
    backend = HTTPBackend(live.base_url)
    try:
        max_len = live.engine.config.scheduler.max_model_len
        backend.submit("too-long", BenchRequest(tuple([5] * max_len), output_len=4), time.monotonic())
        deadline = time.monotonic() + 30
        records = []
        while not records and time.monotonic() < deadline:
            records = backend.poll(0.05)
        [record] = records
        assert not record.ok and record.error.startswith("HTTP 400")
    finally:
        backend.close()
