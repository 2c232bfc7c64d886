"""The host tier's break-even: the measured bench serves each kind of request as it names it
(a miss computes, a host hit loads, a device hit hits), the fixed cost of a loading step is
fit from such rows, the h200 profile holds that fit, and a step's host loads pay it once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.policies import bench_strata_breakeven, fit_host_loads
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import CopyMechanism, get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.model.loader import resolve_model_config
from kvtier.offload.items import copy_seconds, price_host_loads, price_host_loads_direct

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "results/calibration/host_loads_h200.json"


def cost_model(hw: str = "h200") -> CostModel:
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    calib = ROOT / "results/calibration/calib_h200_llama-3.1-8b.json"
    return CostModel(mc, get_hardware(hw), Calibration.load(str(calib)),
                     CostModelConfig(block_bytes=256 << 10))


def test_the_measured_bench_serves_each_kind_as_named(tmp_path):
    out = tmp_path / "b.json"
    bench_strata_breakeven.main(["--quick", "--device", "cpu", "--io-backends", "direct",
                                 "--out", str(out)])
    rows = json.loads(out.read_text())["io_backends"]["direct"]["rows"]
    assert [r["tokens"] for r in rows] == list(bench_strata_breakeven.QUICK_LENGTHS)
    for r in rows:
        n = r["tokens"]
        assert r["miss_host_hit_tokens"] == [0, 0] and r["miss_device_hit_tokens"] == [0, 0]
        assert r["host_hit_host_hit_tokens"] == [n, n]
        assert r["host_hit_device_hit_tokens"] == [0, 0]
        assert r["device_hit_device_hit_tokens"] == [n, n]
        assert r["device_hit_host_hit_tokens"] == [0, 0]


def test_the_fit_recovers_a_constant_beside_the_copy():
    def copy(n):
        return 1e-6 * n

    rows = [{"tokens": n, "device_hit_ttft_s": 0.01,
             "host_hit_ttft_s": 0.01 + 2e-3 + copy(n)} for n in (16, 64, 256)]
    fit = fit_host_loads.fit_backend(rows, copy, max_tokens=64)
    assert fit["step_fixed_s"] == pytest.approx(2e-3) and fit["fit_rows"] == 2
    assert fit["rows"][2]["priced_load_s"] == pytest.approx(2e-3 + copy(256))


@pytest.mark.parametrize("backend,mechanism", [("kernel", CopyMechanism.KERNEL_GATHER),
                                               ("direct", CopyMechanism.MEMCPY_BATCH)])
def test_the_h200_profile_holds_the_fit(backend, mechanism):
    fit = json.loads(FIT.read_text())["io_backends"][backend]
    assert get_hardware("h200").host_load_step_s[mechanism] == pytest.approx(
        fit["step_fixed_s"], rel=5e-3)


def test_a_loading_step_pays_the_fixed_cost_once_and_a_step_without_loads_nothing():
    cm = cost_model()
    hw = cm.hw
    for price, mechanism, direct in ((price_host_loads, CopyMechanism.KERNEL_GATHER, False),
                                     (price_host_loads_direct, CopyMechanism.MEMCPY_BATCH, True)):
        assert price(cm, 0) == copy_seconds(cm, 0, True, direct=direct)  # no fixed cost
        for pages in (1, 64):
            assert price(cm, pages) == pytest.approx(
                copy_seconds(cm, pages, True, direct=direct) + hw.host_load_step_s[mechanism])


def test_an_unmeasured_profile_prices_the_copy_alone():
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    cm = CostModel(mc, get_hardware("a100"), None, CostModelConfig(block_bytes=256 << 10))
    assert price_host_loads(cm, 8) == copy_seconds(cm, 8, True)


def test_the_models_plot_reads_the_measured_break_even_and_nothing_when_absent(tmp_path):
    from benchmarks.policies.strata_breakeven import measured_ratios

    got = measured_ratios(str(ROOT / "results/policies/strata_breakeven_measured_h200.json"))
    (model, backends), = got.items()
    assert model == "llama-3.1-8b" and set(backends) == {"direct", "kernel"}
    assert [n for n, _ in backends["direct"]] == list(bench_strata_breakeven.LENGTHS)
    assert measured_ratios(str(tmp_path / "none.json")) == {}
