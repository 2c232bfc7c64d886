"""What a host-tier copy no layer waits for costs the forward beside it: the fit reads the
prefill's extra time over the bytes moved beside it, the h200 profile holds the fit, a
step's backups and prefetches are priced at it per io-backend and direction, and a profile
without a fit prices them at nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.kernels import fit_beside_forward
from kvtier.costmodel.hardware import CopyMechanism, get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.model.loader import resolve_model_config
from kvtier.offload.items import (
    price_backups,
    price_backups_direct,
    price_prefetches,
    price_prefetches_direct,
)

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "results/calibration/beside_forward_h200.json"
BLOCK = 256 << 10


def cost_model(hw: str) -> CostModel:
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    return CostModel(mc, get_hardware(hw), None, CostModelConfig(block_bytes=BLOCK))


def test_the_fit_is_the_extra_time_over_the_bytes_moved_beside_the_prefill():
    row = {"prefill_ms_alone": 200.0, "prefill_ms_with": 220.0, "copy_GBps": 40.0,
           "copy_span_over_prefill": 0.5}  # the copies ran for half of the 220 ms
    fit = fit_beside_forward.seconds_per_byte(row)
    assert fit["bytes_beside"] == pytest.approx(40e9 * 0.110)
    assert fit["s_per_byte"] == pytest.approx(0.020 / (40e9 * 0.110))
    row["copy_span_over_prefill"] = 1.3  # longer than the prefill: only its span counts
    assert fit_beside_forward.seconds_per_byte(row)["bytes_beside"] == pytest.approx(40e9 * 0.22)


def test_the_fit_is_the_mean_of_the_runs_for_the_tiers_own_launches():
    def run(extra_ms: float) -> dict:
        rows = [{"variant": v, "direction": d, "prefill_ms_alone": 100.0,
                 "prefill_ms_with": 100.0 + extra_ms, "copy_GBps": 10.0,
                 "copy_span_over_prefill": 1.0}
                for v in fit_beside_forward.VARIANTS.values() for d in ("h2d", "d2h")]
        rows.append({**rows[0], "variant": "p9w4t64", "prefill_ms_with": 900.0})  # not ours
        return {"rows": rows}

    fits = fit_beside_forward.fit([run(1.0), run(3.0)])
    for backend in ("kernel", "direct"):
        for d in ("h2d", "d2h"):
            each = [r["s_per_byte"] for r in fits[backend][d]["runs"]]
            assert each == pytest.approx([1e-3 / (10e9 * 0.101), 3e-3 / (10e9 * 0.103)])
            assert fits[backend][d]["s_per_byte"] == pytest.approx(sum(each) / 2)


@pytest.mark.parametrize("backend,mechanism", [("kernel", CopyMechanism.KERNEL_GATHER),
                                               ("direct", CopyMechanism.MEMCPY_BATCH)])
def test_the_h200_profile_holds_the_fit(backend, mechanism):
    fit = json.loads(FIT.read_text())["io_backends"][backend]  # the runs' mean
    cost = get_hardware("h200").beside_forward[mechanism]
    assert cost.h2d_s_per_byte == pytest.approx(fit["h2d"]["s_per_byte"], rel=5e-3)
    assert cost.d2h_s_per_byte == pytest.approx(fit["d2h"]["s_per_byte"], rel=5e-3)


def test_backups_and_prefetches_pay_their_bytes_at_their_backends_rate():
    cm = cost_model("h200")
    fits = get_hardware("h200").beside_forward
    kernel, direct = fits[CopyMechanism.KERNEL_GATHER], fits[CopyMechanism.MEMCPY_BATCH]
    for pages in (1, 64):
        nbytes = pages * BLOCK
        assert price_backups(cm, pages) == pytest.approx(kernel.d2h_s_per_byte * nbytes)
        assert price_prefetches(cm, pages) == pytest.approx(kernel.h2d_s_per_byte * nbytes)
        assert price_backups_direct(cm, pages) == pytest.approx(direct.d2h_s_per_byte * nbytes)
        assert price_prefetches_direct(cm, pages) == pytest.approx(
            direct.h2d_s_per_byte * nbytes)
    assert price_backups(cm, 0) == 0.0


def test_an_unmeasured_profile_prices_them_at_nothing():
    cm = cost_model("a100")
    assert not cm.hw.beside_forward
    for price in (price_backups, price_backups_direct, price_prefetches,
                  price_prefetches_direct):
        assert price(cm, 64) == 0.0
