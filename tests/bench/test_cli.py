"""`kvtier bench` options -> workload and config; prepared workloads round-trip."""

import argparse

import pytest

from kvtier.bench.arrivals import PAPER_AZURE_CV, ArrivalKind
from kvtier.bench.cli import (
    add_bench_parser,
    arrival_spec,
    bench_config,
    length_limits,
    workload_spec,
)
from kvtier.bench.prepared import load_prepared, save_prepared
from kvtier.bench.request import BenchRequest, LengthLimits


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    return parser.parse_args(["bench", "--model", "tiny-llama", *argv])


def test_defaults_and_engine_options_together():
    a = parse("--kv-policy", "swap", "--num-gpu-blocks", "12", "--seed", "3")
    assert a.policies == "recompute,swap" and a.workload == "sharegpt"
    assert arrival_spec(a).kind is ArrivalKind.OFFLINE
    assert (a.num_gpu_blocks, a.seed, a.workload_seed) == (12, 3, 0)  # engine seed != workload seed
    cfg = bench_config(a)
    assert cfg.policies == ("recompute", "swap") and cfg.slo is None and cfg.sweep is None


def test_vllms_bench_flags():
    """vllm bench serve's names: --dataset-name random, --random-input-len/-output-len/
    -range-ratio, and --request-rate (Poisson arrivals unless --arrivals says otherwise)."""
    a = parse("--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "8",
              "--random-range-ratio", "0.5", "--request-rate", "4")
    assert (a.workload, a.input_len, a.output_len, a.range_ratio) == ("synthetic", 64, 8, 0.5)
    spec = arrival_spec(a)
    assert spec.kind is ArrivalKind.POISSON and spec.rate == 4.0
    assert arrival_spec(parse("--arrivals", "gamma", "--rate", "2")).kind is ArrivalKind.GAMMA
    with pytest.raises(SystemExit, match="--rate needs arrivals"):
        arrival_spec(parse("--arrivals", "offline", "--rate", "2"))


def test_slo_in_ms_and_sweep():
    cfg = bench_config(parse("--slo-ttft", "250", "--slo-tpot", "40", "--goodput-sweep",
                             "--sweep-rates", "1,2,4", "--policies", "swap, recompute",
                             "--arrivals", "poisson", "--rate", "1"))
    assert (cfg.slo.ttft_s, cfg.slo.tpot_s) == (0.25, 0.04)
    assert cfg.sweep.rates == (1.0, 2.0, 4.0) and cfg.policies == ("swap", "recompute")


def test_sweep_needs_slo_and_a_rate():
    with pytest.raises(SystemExit, match="slo"):
        bench_config(parse("--goodput-sweep", "--arrivals", "poisson", "--rate", "1"))
    with pytest.raises(SystemExit, match="offline"):
        bench_config(parse("--goodput-sweep", "--slo-ttft", "100"))


def test_length_limits_follow_dataset_and_context():
    assert length_limits(parse(), 4096) == LengthLimits(4, 4, 1024, 2048)
    assert length_limits(parse(), 512) == LengthLimits(4, 4, 511, 512)
    assert length_limits(parse("--workload", "leval"), 8192) == LengthLimits(4, 4, 8191, 8192)
    custom = parse("--max-prompt-len", "100", "--max-total-len", "300", "--min-output-len", "8")
    assert length_limits(custom, 4096) == LengthLimits(4, 8, 100, 300)


def test_arrivals():
    assert arrival_spec(parse()).kind is ArrivalKind.OFFLINE
    g = arrival_spec(parse("--arrivals", "gamma", "--rate", "5"))
    assert (g.kind, g.rate, g.cv) == (ArrivalKind.GAMMA, 5.0, PAPER_AZURE_CV)
    p = arrival_spec(parse("--arrivals", "paper-gamma", "--rate-scale", "2"))
    assert p.rate == pytest.approx(2 / 0.011075) and p.cv == PAPER_AZURE_CV
    with pytest.raises(SystemExit):
        arrival_spec(parse("--arrivals", "poisson"))
    with pytest.raises(SystemExit):
        arrival_spec(parse("--arrivals", "trace"))


def test_trace_arrivals_and_replay(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                   + "".join(f"2023-11-16 00:00:{i:02d}.0,{20 + i},{10 + i}\n" for i in range(0, 40, 2)))
    gaps = arrival_spec(parse("--arrivals", "trace", "--trace-path", str(csv), "--rate-scale", "4"))
    assert gaps.mean_rate == pytest.approx(2.0)
    replay = workload_spec(parse("--workload", "azure", "--dataset-path", str(csv), "--arrivals",
                                 "trace", "--trace-start", "5", "--num-prompts", "3"), 4096)
    assert replay.arrivals.trace_gaps_s[:2] == (2.0, 2.0) and len(replay.arrivals.trace_gaps_s) == 14
    assert replay.trace_start == 5 and replay.path == str(csv)


def test_prepared_round_trip(tmp_path):
    reqs = [BenchRequest((1, 2, 3, 4), 5, 0.0), BenchRequest(tuple(range(50)), 9, 0.1),
            BenchRequest((7, 8, 9, 10, 11), 6, 0.3)]
    path = tmp_path / "w.json"
    save_prepared(reqs, path, {"spec": {"dataset": "x"}})
    got = load_prepared(path, 2, LengthLimits(max_prompt_len=10, max_total_len=None))
    assert got == [BenchRequest((1, 2, 3, 4), 5), BenchRequest((7, 8, 9, 10, 11), 6)]
    with pytest.raises(ValueError, match="only 2"):
        load_prepared(path, 3, LengthLimits(max_prompt_len=10, max_total_len=None))


def test_unknown_policy_fails_before_running():
    from kvtier.bench.cli import run_bench

    with pytest.raises(SystemExit, match="unknown policies"):
        run_bench(parse("--policies", "recompute,swapp", "--load-format", "dummy"))


def test_prepared_keeps_the_papers_gaps(tmp_path, word_tokenizer):
    from kvtier.bench.cli import run_bench

    path = tmp_path / "w.json"
    rc = run_bench(parse("--load-format", "dummy", "--workload", "synthetic", "--num-prompts", "5",
                         "--save-workload", str(path), "--prepare-only"))
    assert rc == 0 and len(load_prepared(path, 5, LengthLimits())) == 5
    sharegpt = tmp_path / "s.json"
    save_prepared([BenchRequest((1, 2, 3, 4), 5)], sharegpt, {"dataset": "sharegpt-v3 (first turn)"})
    spec = arrival_spec(parse("--workload", "prepared", "--dataset-path", str(sharegpt),
                              "--arrivals", "paper-gamma"))
    assert 1 / spec.rate == pytest.approx(0.011075)  # ShareGPT's halved gaps


def test_base_url_is_one_run_of_the_servers_policy():
    url = ("--base-url", "http://127.0.0.1:1")
    assert bench_config(parse(*url)).policies == ("server",)  # the default list is not run
    assert bench_config(parse(*url, "--policies", "swap")).policies == ("swap",)
    with pytest.raises(SystemExit, match="one server, which serves one policy"):
        bench_config(parse(*url, "--policies", "recompute,swap"))
    assert bench_config(parse("--policies", "recompute,swap")).policies == ("recompute", "swap")


def test_base_url_silences_httpx_request_lines():
    import logging

    from kvtier.bench.cli import _http_backends

    httpx_log, root = logging.getLogger("httpx"), logging.getLogger()
    old, old_root = httpx_log.level, root.level
    try:
        httpx_log.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(logging.INFO)  # as `kvtier` sets it
        _http_backends(parse("--base-url", "http://127.0.0.1:1"))  # builds no backend yet
        assert not httpx_log.isEnabledFor(logging.INFO)
        assert httpx_log.isEnabledFor(logging.WARNING)
    finally:
        httpx_log.setLevel(old)
        root.setLevel(old_root)


def _trace(tmp_path, rows):
    csv = tmp_path / "trace.csv"
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 00:00:{i:02d}.0,{c},{g}\n" for i, (c, g) in enumerate(rows)))
    return str(csv)


def test_a_traces_lengths_are_the_workload(tmp_path, word_tokenizer):
    """No ShareGPT filter on a trace: only what max_model_len cannot hold is truncated, and said."""
    from kvtier.bench.workload import build_workload

    rows = [(2076, 300), (1500, 28), (3, 2), (4000, 500)]
    args = parse("--workload", "azure", "--dataset-path", _trace(tmp_path, rows),
                 "--num-prompts", "4")
    assert length_limits(args, 8192) == LengthLimits(1, 1, 8191, 8192)
    whole = build_workload(workload_spec(args, 8192), word_tokenizer, 1000)
    assert [(r.prompt_len, r.output_len) for r in whole.requests] == rows
    assert whole.length_report.num_outside == 0 and whole.summary()["outside_length_limits"] == 0
    cut = build_workload(workload_spec(args, 2048), word_tokenizer, 1000)
    assert [(r.prompt_len, r.output_len) for r in cut.requests][1:3] == rows[1:3]
    assert cut.length_report.num_outside == 2 and cut.length_report.action == "truncated"
    assert all(r.prompt_len + r.output_len <= 2048 for r in cut.requests)
    assert cut.summary()["outside_length_action"] == "truncated"


def test_a_prepared_workload_keeps_its_own_limits(tmp_path, word_tokenizer):
    from kvtier.bench.workload import build_workload

    path = tmp_path / "long.json"
    reqs = [BenchRequest(tuple(range(1, n + 1)), out) for n, out in ((1800, 400), (20, 3), (900, 40))]
    save_prepared(reqs, path)
    args = parse("--workload", "prepared", "--dataset-path", str(path), "--num-prompts", "2")
    kept = build_workload(workload_spec(args, 4096), word_tokenizer, 1000)
    assert [(r.prompt_len, r.output_len) for r in kept.requests] == [(1800, 400), (20, 3)]
    assert kept.length_report.num_outside == 0
    short = build_workload(workload_spec(args, 1024), word_tokenizer, 1000)
    assert [(r.prompt_len, r.output_len) for r in short.requests] == [(20, 3), (900, 40)]
    assert (short.length_report.num_outside, short.length_report.action) == (1, "dropped")
