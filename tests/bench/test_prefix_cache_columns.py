"""The bench's prefix-cache figures: per-request cached tokens (RequestOutput.num_cached_tokens
through the engine backend), the summary's hit rate, the engine's counters, the table's
columns, result.json and the requests CSV; and a warm-up that leaves nothing cached."""

from __future__ import annotations

import csv
import io
import json

import pytest
from rich.console import Console

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.backend import RequestRecord
from kvtier.bench.experiment import BenchConfig, engine_backends, run_experiment
from kvtier.bench.metrics import summarize
from kvtier.bench.report import write_result_dir
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions
from kvtier.bench.table import print_table
from kvtier.bench.workload import Dataset, Workload, WorkloadSpec
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine

BLOCK = 4
DOC = tuple(50 + (13 * i) % 700 for i in range(18))  # 4 full blocks and 2 tokens


def _engine(policy: str) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(
        model="tiny-llama", load_format="dummy", dtype="float32", device="cpu",
        attention_backend="torch", max_model_len=64, block_size=BLOCK, layers_per_block=1,
        num_gpu_blocks=400, num_host_blocks=0, max_num_seqs=4, max_num_batched_tokens=64,
        enable_prefix_caching=policy == "cache"))


def _workload() -> Workload:
    """A document with six questions, one every 0.3 s (each arrives after the previous
    one's prefill), plus one unrelated prompt."""
    requests = [BenchRequest(DOC + (900 + i, 901 + i), output_len=3, arrival_s=0.3 * i)
                for i in range(6)]
    requests.append(BenchRequest((3, 4, 5, 6, 7, 8, 9), output_len=3, arrival_s=1.8))
    spec = WorkloadSpec(Dataset.SYNTHETIC, len(requests), ArrivalSpec(ArrivalKind.OFFLINE))
    return Workload(spec, tuple(requests))


@pytest.fixture(scope="module")
def experiment():
    workload = _workload()
    config = BenchConfig(policies=("nocache", "cache"), run=RunOptions(progress=False),
                         monitor_gpu=False, warmup_requests=2)
    return workload, run_experiment(workload, engine_backends(_engine), config, log=lambda s: None)


def test_cached_tokens_per_request_and_in_the_summary(experiment):
    workload, (off, on) = experiment
    by_id = {r.request_id: r for r in on.run.records}
    cached = [by_id[f"cache-{i}"].num_cached_tokens for i in range(len(workload.requests))]
    # The warm-up ran the first two prompts, then emptied the cache: the first measured
    # request misses; each later question hits the document's 4 full blocks.
    assert cached == [0] + [4 * BLOCK] * 5 + [0]
    prompt = sum(r.prompt_len for r in workload.requests)
    assert on.summary.num_cached_tokens == 5 * 4 * BLOCK
    assert on.summary.prefix_cache_hit_rate == pytest.approx(5 * 4 * BLOCK / prompt)
    assert off.summary.num_cached_tokens == 0 and off.summary.prefix_cache_hit_rate == 0.0
    # The engine's counters agree (no preemption: every lookup is a new request's).
    assert on.engine["num_prefix_cache_hits"] == on.summary.num_cached_tokens
    assert on.engine["num_prefix_cache_queries"] == prompt
    assert on.engine["prefix_cache_hit_rate"] == pytest.approx(on.summary.prefix_cache_hit_rate)
    assert off.engine["prefix_cache_hit_rate"] is None  # the cache is off: no lookups
    # Cached prompt tokens are not computed.
    assert (off.engine["num_prompt_tokens"] - on.engine["num_prompt_tokens"]
            == on.summary.num_cached_tokens)


def test_table_shows_hit_rate_and_cached_tokens(experiment):
    _, results = experiment
    buf = io.StringIO()
    print_table(results, console=Console(file=buf, width=400))
    lines = buf.getvalue().splitlines()
    header = next(line for line in lines if "hit %" in line)
    assert "cached tok" in header
    row = next(line for line in lines if line.strip("│┃ ").startswith("cache "))
    assert str(_cached_total(results)) in row.split()


def _cached_total(results) -> int:
    return results[1].summary.num_cached_tokens


def test_result_json_and_requests_csv(experiment, tmp_path):
    workload, results = experiment
    path = write_result_dir(tmp_path, results, workload, {}, "kvtier bench")
    doc = json.loads(path.read_text())
    summary = doc["policies"]["cache"]["summary"]
    assert summary["num_cached_tokens"] == _cached_total(results)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(results[1].summary.prefix_cache_hit_rate)
    assert doc["policies"]["cache"]["engine"]["num_prefix_cache_hits"] == _cached_total(results)
    with open(tmp_path / doc["files"]["requests"]["cache"]) as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["num_cached_tokens"]) for r in rows) == _cached_total(results)
    assert all(float(r["queue_s"]) >= 0 for r in rows)  # the engine stamps its scheduling


def _record(rid: str, prompt_len: int, cached: int | None, reason: str = "length") -> RequestRecord:
    return RequestRecord(rid, prompt_len, 2, 0.0, 0.1, (0.1, 0.2), 0.2, reason,
                         num_cached_tokens=cached)


def test_summary_counts_only_completed_requests_that_report():
    records = [_record("a", 40, 32), _record("b", 10, None), _record("c", 20, 0),
               _record("d", 50, 48, reason="abort")]
    s = summarize(records, 1.0)
    assert s.num_cached_tokens == 32 and s.prefix_cache_hit_rate == pytest.approx(32 / 60)
    none = summarize([_record("b", 10, None)], 1.0)
    assert none.num_cached_tokens is None and none.prefix_cache_hit_rate is None


def test_table_leaves_the_columns_out_when_no_backend_reports(experiment):
    _, results = experiment
    from dataclasses import replace

    silent = [replace(r, summary=replace(r.summary, num_cached_tokens=None,
                                         prefix_cache_hit_rate=None)) for r in results]
    buf = io.StringIO()
    print_table(silent, console=Console(file=buf, width=400))
    assert "hit %" not in buf.getvalue() and "cached tok" not in buf.getvalue()
