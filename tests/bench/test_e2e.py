"""`kvtier bench` end to end on the real engine: tiny model on CPU, recompute vs swap, a KV
pool small enough that requests are preempted."""

import csv
import json

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture
def one_thread():
    # The tiny model's ops are too small to split; one thread is faster and steadier.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_bench_recompute_vs_swap(tmp_path, one_thread, capsys):
    from kvtier.cli import main

    out = tmp_path / "run"
    rc = main([
        "bench", "--model", "tiny-llama", "--load-format", "dummy", "--device", "cpu",
        "--policies", "recompute,swap", "--workload", "sharegpt", "--num-prompts", "16",
        "--max-prompt-len", "64", "--max-total-len", "192", "--max-model-len", "192",
        "--arrivals", "gamma", "--rate", "20", "--num-gpu-blocks", "12", "--num-host-blocks", "64",
        "--slo-ttft", "5000", "--slo-tpot", "500", "--warmup-requests", "1", "--no-progress",
        "--out", str(out),
    ])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "swap / recompute" in printed and "result.json" in printed

    doc = json.loads((out / "result.json").read_text())
    assert doc["command"].startswith("kvtier") and doc["config"]["engine"]["model"] == "tiny-llama"
    rec, swap = doc["policies"]["recompute"], doc["policies"]["swap"]
    expected_tokens = doc["workload"]["total_output_tokens"]
    for p in (rec, swap):
        assert p["summary"]["num_completed"] == 16
        assert p["engine"]["num_generation_tokens"] == expected_tokens  # ignore_eos: same work
        assert p["engine"]["num_preemptions"] > 0  # 12 blocks of 16 tokens: memory pressure
        assert 0 < p["summary"]["slo_attainment"] <= 1
    assert rec["engine"]["num_recomputed_tokens"] > 0 and rec["engine"]["num_swap_out_blocks"] == 0
    assert swap["engine"]["num_swap_out_blocks"] > 0 and swap["engine"]["num_recomputed_tokens"] == 0
    assert swap["engine"]["max_host_blocks_used"] > 0
    assert "summary.ttft_s.p50" in doc["ratios_vs_first"]["swap"]

    for policy in ("recompute", "swap"):
        rows = list(csv.DictReader(open(out / f"requests_{policy}.csv")))
        assert len(rows) == 16
        assert all(int(r["output_len"]) == int(r["expected_output_len"]) for r in rows)
        assert sum(int(r["num_preemptions"]) for r in rows) == doc["policies"][policy]["engine"]["num_preemptions"]
        assert (out / f"steps_{policy}.csv").stat().st_size > 0
    for png in ("latency_cdf.png", "kv_and_running.png"):
        assert (out / png).stat().st_size > 10_000


def test_demo_runs_and_saves_workload(tmp_path, capsys):
    """`make run`'s entry point, shortened (the full demo: 60 prompts, 20 s to 2 min on 2 cores)."""
    from kvtier.bench.cli import demo_argv, demo_main

    n = torch.get_num_threads()
    try:
        rc = demo_main(["--num-prompts", "6", "--out", str(tmp_path / "demo"),
                        "--save-workload", str(tmp_path / "w.json"), "--no-progress"])
    finally:
        torch.set_num_threads(n)  # demo_main pins one thread for the process
    assert rc == 0
    doc = json.loads((tmp_path / "demo" / "result.json").read_text())
    assert list(doc["policies"]) == ["recompute", "swap", "ellm"]
    assert doc["workload"]["spec"]["arrivals"]["kind"] == "gamma"
    assert doc["command"].startswith("kvtier bench " + " ".join(demo_argv()[:2]))
    saved = json.loads((tmp_path / "w.json").read_text())
    assert len(saved["requests"]) == 6 and saved["spec"]["dataset"] == "sharegpt"


def test_bench_goodput_sweep(tmp_path, one_thread):
    """The load sweep on the real engine. The pool holds about two requests: at 1000 req/s
    all eight arrive at once and queue or get preempted; at 2 req/s most find it free."""
    from kvtier.cli import main

    out = tmp_path / "sweep"
    rc = main([
        "bench", "--model", "tiny-llama", "--load-format", "dummy", "--device", "cpu",
        "--policies", "swap", "--workload", "synthetic", "--input-len", "32", "--output-len", "64",
        "--num-prompts", "8", "--max-model-len", "128", "--num-gpu-blocks", "12",
        "--num-host-blocks", "32", "--arrivals", "poisson", "--rate", "1000", "--slo-ttft", "30",
        "--goodput-sweep", "--sweep-rates", "2,1000", "--warmup-requests", "1", "--no-progress",
        "--out", str(out),
    ])
    assert rc == 0
    goodput = json.loads((out / "result.json").read_text())["policies"]["swap"]["goodput"]
    low, high = sorted(goodput["probes"], key=lambda p: p["rate"])
    assert (low["rate"], high["rate"]) == (2.0, 1000.0)
    assert low["num_completed"] == high["num_completed"] == 8
    assert high["ttft_p90_s"] > low["ttft_p90_s"]  # queueing
    assert low["attainment"] >= high["attainment"]
    assert high["num_preemptions"] > 0
    assert (out / "load_sweep.png").stat().st_size > 10_000
