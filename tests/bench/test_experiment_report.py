"""run_experiment on fake engines (virtual clock) -> result directory, table, plots."""

import csv
import io
import json

import pytest
from rich.console import Console

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.experiment import BenchConfig, SweepConfig, engine_backends, run_experiment
from kvtier.bench.metrics import Slo
from kvtier.bench.report import flatten, ratios, write_result_dir
from kvtier.bench.runner import RunOptions
from kvtier.bench.table import print_table
from kvtier.bench.workload import Dataset, WorkloadSpec, build_workload
from tests.bench.fake_engine import FakeEngine, VirtualClock

# Two "policies" that differ only in how fast a step is: "slow" takes twice as long.
SPEEDS = {"fast": 0.002, "slow": 0.004}


@pytest.fixture(scope="module")
def experiment():
    from tests.bench.conftest import WordTokenizer

    spec = WorkloadSpec(Dataset.SYNTHETIC, 24, ArrivalSpec(ArrivalKind.POISSON, rate=20.0),
                        seed=3, input_len=12, output_len=20, range_ratio=0.5)
    workload = build_workload(spec, WordTokenizer(), 1000)
    clock = VirtualClock()
    engines = lambda policy: FakeEngine(clock, num_blocks=12, block_size=4,  # noqa: E731
                                        base_s=SPEEDS[policy], per_token_s=1e-4)
    config = BenchConfig(policies=("fast", "slow"), slo=Slo(ttft_s=0.05, tpot_s=0.01),
                         run=RunOptions(progress=False), sweep=SweepConfig(rates=(2.0, 10.0, 40.0)),
                         monitor_gpu=False)
    results = run_experiment(workload, engine_backends(engines, clock=clock), config, log=lambda s: None)
    return workload, results


def test_policies_side_by_side(experiment):
    _, results = experiment
    fast, slow = results
    assert (fast.policy, slow.policy) == ("fast", "slow")
    assert fast.summary.num_completed == slow.summary.num_completed == 24
    assert fast.engine["num_preemptions"] > 0  # 12 blocks of 4 tokens: memory pressure
    assert slow.summary.tpot_s.p50 == pytest.approx(2 * fast.summary.tpot_s.p50, rel=0.1)
    for r in results:
        rates = [p.rate for p in r.goodput.probes]
        assert rates == [2.0, 10.0, 40.0]
        assert r.goodput.probes[0].extra["num_completed"] == 24
    # Virtual time makes the sweep exact: the slower engine queues past 2 req/s.
    assert (fast.goodput.rate, slow.goodput.rate) == (10.0, 2.0)


def test_result_dir(experiment, tmp_path):
    workload, results = experiment
    path = write_result_dir(tmp_path, results, workload, {"engine": {"model": "fake"}}, "kvtier bench --x")
    doc = json.loads(path.read_text())
    assert doc["command"] == "kvtier bench --x" and doc["git"]["commit"]
    assert {"date", "cpu", "torch", "triton", "gpu"} <= doc.keys()
    assert doc["workload"]["num_requests"] == 24 and doc["workload"]["spec"]["dataset"] == "synthetic"
    fast = doc["policies"]["fast"]
    assert fast["summary"]["num_completed"] == 24 and fast["engine"]["num_preemptions"] > 0
    assert fast["goodput"]["probes"][0]["rate"] == 2.0 and fast["goodput"]["goodput_rate"] == 10.0
    r = doc["ratios_vs_first"]["slow"]
    assert r["summary.tpot_s.p50"] == pytest.approx(
        doc["policies"]["slow"]["summary"]["tpot_s"]["p50"] / fast["summary"]["tpot_s"]["p50"])
    for name in ("latency_cdf.png", "kv_and_running.png", "load_sweep.png"):
        assert (tmp_path / name).stat().st_size > 10_000
    rows = list(csv.DictReader(open(tmp_path / "requests_slow.csv")))
    assert len(rows) == 24 and rows[0]["request_id"] == "slow-0"
    assert float(rows[0]["e2e_s"]) >= float(rows[0]["ttft_s"]) > 0
    steps = list(csv.DictReader(open(tmp_path / "steps_fast.csv")))
    assert len(steps) == fast["engine"]["num_steps"]
    assert int(steps[-1]["num_preemptions_total"]) - int(steps[0]["num_preemptions_total"]) >= 0


def test_table_shows_ratio_row(experiment):
    _, results = experiment
    buf = io.StringIO()
    print_table(results, console=Console(file=buf, width=250))
    text = buf.getvalue()
    assert "slow / fast" in text and "fast" in text
    ratio = results[1].summary.tpot_s.p50 / results[0].summary.tpot_s.p50
    assert f"{ratio:.2f}x" in text


def test_flatten_and_ratios():
    a = {"x": 2, "d": {"y": 4.0, "z": 0, "s": "text", "b": True}, "l": [1]}
    assert flatten(a) == {"x": 2.0, "d.y": 4.0, "d.z": 0.0}
    assert ratios(a, {"x": 3, "d": {"y": 1.0, "z": 5}}) == {"x": 1.5, "d.y": 0.25, "d.z": None}


def test_without_the_bench_extra_results_are_kept_and_plots_said_missing(
        experiment, tmp_path, monkeypatch, caplog):
    from kvtier.bench import extras

    monkeypatch.setattr(extras, "has_module", lambda name: name not in ("matplotlib", "pynvml"))
    extras.warn_missing_extras(gpu_monitor=False)
    assert "matplotlib is not installed" in caplog.text and "kvtier[bench]" in caplog.text
    workload, results = experiment
    doc = json.loads(write_result_dir(tmp_path, results, workload, {}, "kvtier bench").read_text())
    assert doc["files"]["plots"] == {} and not list(tmp_path.glob("*.png"))
    assert doc["policies"]["fast"]["summary"]["num_completed"] == 24
