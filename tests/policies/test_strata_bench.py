"""bench_strata's sweeps: write policies over (b)-(d) and loading bounds over (d), each run
under a label of its own with the flags it names; without them the runs are (a)-(d) as
before; bad sweep values stop the script before any run."""

from __future__ import annotations

import json

import pytest

from benchmarks.policies.bench_strata import (
    Run,
    main,
    parse_args,
    plan_runs,
    run_host_args,
    variant_args,
)
from kvtier.offload.args import HostTierArgs


def test_without_sweeps_the_runs_are_the_variants_as_before():
    runs = plan_runs("a,b,c,d")
    assert [r.label for r in runs] == ["a", "b", "c", "d"]
    base = HostTierArgs(hicache_loading_bound=3.0)
    for r in runs:
        assert run_host_args(r, base, 64.0) == variant_args(r.variant, base, 64.0)
    assert run_host_args(runs[3], base, 64.0).hicache_loading_bound == 3.0


def test_write_policies_run_each_host_variant_and_a_once():
    runs = plan_runs("a,c,d", ["write_through", "write_back"])
    assert [r.label for r in runs] == ["a", "c/write_through", "c/write_back",
                                       "d/write_through", "d/write_back"]
    args = run_host_args(runs[2], HostTierArgs(), 64.0)
    assert args.hicache_write_policy == "write_back" and args.hicache_io_backend == "kernel"
    assert run_host_args(runs[0], HostTierArgs(), 64.0) == HostTierArgs()  # (a): no tier


def test_loading_bounds_sweep_d_and_combine_with_write_policies():
    runs = plan_runs("a,d", loading_bounds=[0.0, 2.0, 0.5])
    assert [r.label for r in runs] == ["a", "d/lb=0", "d/lb=2", "d/lb=0.5"]
    bounds = [run_host_args(r, HostTierArgs(), 64.0).hicache_loading_bound for r in runs[1:]]
    assert bounds == [0.0, 2.0, 0.5]
    both = plan_runs("c,d", ["write_back"], [4.0])
    assert [r.label for r in both] == ["c/write_back", "d/write_back/lb=4"]
    assert both[1] == Run("d/write_back/lb=4", "d", "write_back", 4.0)


@pytest.mark.parametrize("argv", [["--write-policies", "write_sometimes"],
                                  ["--loading-bounds", "2,-1"], ["--loading-bounds", "two"],
                                  ["--load-programs", "0"], ["--load-programs", "2.5"]])
def test_bad_sweep_values_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit) as done:
        parse_args(argv)
    assert done.value.code == 2
    assert "--" + argv[0].lstrip("-") in capsys.readouterr().err


def test_load_programs_sweep_the_kernel_variants():
    runs = plan_runs("a,b,c,d", load_programs=[2, 8])
    assert [r.label for r in runs] == ["a", "b", "c/lp=2", "c/lp=8", "d/lp=2", "d/lp=8"]
    args = run_host_args(runs[3], HostTierArgs(), 64.0)
    assert args.hicache_load_programs == 8 and args.hicache_io_backend == "kernel"
    assert run_host_args(runs[1], HostTierArgs(), 64.0).hicache_load_programs == \
        HostTierArgs().hicache_load_programs
    with pytest.raises(SystemExit, match="variants c and d"):
        plan_runs("a,b", load_programs=[4])


def test_loading_bounds_need_variant_d():
    with pytest.raises(SystemExit, match="add d to --variants"):
        plan_runs("a,c", loading_bounds=[2.0])


def test_a_simulated_sweep_writes_every_run_with_its_flags(tmp_path):
    out = tmp_path / "sweep.json"
    main(["--simulate", "--model", "llama-3.1-8b", "--load-format", "dummy", "--no-progress",
          "--no-gpu-monitor", "--workload", "synthetic", "--num-prompts", "4",
          "--num-gpu-blocks", "1200", "--host-gib", "1", "--max-model-len", "2048",
          "--variants", "a,d", "--write-policies", "write_back", "--loading-bounds", "0,2",
          "--out", str(out)])
    data = json.loads(out.read_text())
    runs = data["variants"]
    assert list(runs) == ["a", "d/write_back/lb=0", "d/write_back/lb=2"]
    assert list(data["ratios_to_a"]) == list(runs)
    assert runs["a"]["host_tier"] is None
    for label, bound in (("d/write_back/lb=0", 0.0), ("d/write_back/lb=2", 2.0)):
        flags = runs[label]["flags"]
        assert flags["hicache_write_policy"] == "write_back"
        assert flags["hicache_loading_bound"] == bound and runs[label]["host_tier"] is not None


def test_a_goodput_sweep_finds_each_variants_rate_at_the_slo(tmp_path):
    out = tmp_path / "goodput.json"
    main(["--simulate", "--model", "llama-3.1-8b", "--load-format", "dummy", "--no-progress",
          "--no-gpu-monitor", "--workload", "synthetic", "--num-prompts", "6",
          "--num-gpu-blocks", "1200", "--host-gib", "1", "--max-model-len", "2048",
          "--arrivals", "poisson", "--rate", "1", "--slo-ttft", "2000", "--variants", "a,c",
          "--goodput-sweep", "--sweep-rates", "1,2", "--out", str(out)])
    data = json.loads(out.read_text())
    for run in data["variants"].values():
        goodput = run["goodput"]
        assert [p["rate"] for p in goodput["probes"]] == [1.0, 2.0]
        assert goodput["goodput_rate"] in (None, 1.0, 2.0)
        met = [p["rate"] for p in goodput["probes"] if p["attainment"] >= 0.9]
        assert goodput["goodput_rate"] == (max(met) if met else None)
    assert "goodput_x" in data["ratios_to_a"]["c"]


def test_schedule_policies_sweep_every_variant_against_its_own_a(tmp_path):
    runs = plan_runs("a,c", schedule_policies=["fcfs", "lpm"])
    assert [r.label for r in runs] == ["a/sp=fcfs", "a/sp=lpm", "c/sp=fcfs", "c/sp=lpm"]
    out = tmp_path / "orders.json"
    main(["--simulate", "--model", "llama-3.1-8b", "--load-format", "dummy", "--no-progress",
          "--no-gpu-monitor", "--workload", "synthetic", "--num-prompts", "4",
          "--num-gpu-blocks", "1200", "--host-gib", "1", "--max-model-len", "2048",
          "--variants", "a,c", "--schedule-policies", "fcfs,lpm", "--out", str(out)])
    data = json.loads(out.read_text())
    assert list(data["variants"]) == [r.label for r in runs]
    assert list(data["ratios_to_a"]) == [r.label for r in runs]
    assert data["ratios_to_a"]["a/sp=lpm"]["throughput_x"] == 1.0
    with pytest.raises(SystemExit):
        parse_args(["--schedule-policies", "random"])
