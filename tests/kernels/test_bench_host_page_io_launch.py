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
