"""Host-row pricing (kvtier/costmodel/hardware.py's HostAttentionCost): the h200 profile
carries the fit of benchmarks/policies/fit_host_rows.py (results/calibration/host_rows_h200.json),
other profiles price host rows from their copies; the systems' item prices use them, and the
placement's moves are priced at the UVA page kernel's rate, not the swap path's."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import (
    CPU_ATTENTION_BYTES_PER_S,
    CopyMechanism,
    HostAttention,
    get_hardware,
)
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.model.loader import resolve_model_config
from kvtier.policies.directkv import price_zero_copy_rows
from kvtier.policies.host_resident.items import price_store
from kvtier.policies.neo import price_cpu_rows

ROOT = Path(__file__).resolve().parents[2]
FIT = ROOT / "results/calibration/host_rows_h200.json"


def cost_model(hw: str = "h200", calib: str | None = None) -> CostModel:
    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    return CostModel(mc, get_hardware(hw), Calibration.load(calib) if calib else None,
                     CostModelConfig(block_bytes=256 << 10))


@pytest.mark.parametrize("mechanism", list(HostAttention))
def test_the_h200_profile_holds_the_fit(mechanism):
    fit = json.loads(FIT.read_text())["mechanisms"][mechanism.value]
    cost = get_hardware("h200").host_attention_cost(mechanism)
    assert cost.layer_s == pytest.approx(fit["layer_s"], rel=2e-3)
    assert cost.bytes_per_s == pytest.approx(fit["bytes_per_s"], rel=2e-3)
    assert cost.split_layer_s == pytest.approx(fit.get("split_layer_s", 0.0), rel=2e-3)


def test_a_step_with_split_rows_pays_the_split_cost_once():
    from kvtier.policies.directkv import price_split_rows

    cm = cost_model()
    split = cm.hw.host_attention_cost(HostAttention.ZERO_COPY).split_layer_s
    assert split > 0 and price_split_rows(cm, 0) == 0.0
    assert price_split_rows(cm, 1) == price_split_rows(cm, 3) == cm.mc.num_layers * split


def test_unfitted_profiles_price_host_rows_from_their_copies():
    hw = get_hardware("a100")
    gather = hw.h2d[CopyMechanism.KERNEL_GATHER]
    zero_copy = hw.host_attention_cost(HostAttention.ZERO_COPY)
    assert zero_copy.layer_s == gather.beta_s
    assert zero_copy.bytes_per_s == pytest.approx(1 / gather.alpha_s_per_byte)
    cpu = hw.host_attention_cost(HostAttention.CPU_ROUND_TRIP)
    assert cpu.layer_s == 2 * hw.d2h[CopyMechanism.BULK].beta_s
    assert cpu.bytes_per_s == CPU_ATTENTION_BYTES_PER_S


@pytest.mark.parametrize("price,mechanism", [(price_zero_copy_rows, HostAttention.ZERO_COPY),
                                             (price_cpu_rows, HostAttention.CPU_ROUND_TRIP)])
def test_a_host_row_pays_a_fixed_cost_beside_its_bytes(price, mechanism):
    cm = cost_model()
    cost = cm.hw.host_attention_cost(mechanism)
    tokens = 2100
    nbytes = tokens * cm.mc.kv_bytes_per_token(2)
    assert price(cm, tokens) == pytest.approx(cm.mc.num_layers * cost.layer_s
                                              + nbytes / cost.bytes_per_s)
    assert price(cm, tokens) > 1.3 * nbytes / cost.bytes_per_s  # not the bytes alone
    # A second row adds its bytes only.
    assert price(cm, 2 * tokens) - price(cm, tokens) == pytest.approx(nbytes / cost.bytes_per_s)


def test_moves_are_priced_at_the_page_kernels_rate_not_the_swap_paths():
    cm = cost_model(calib=str(ROOT / "results/calibration/calib_h200_llama-3.1-8b.json"))
    blocks = 1024
    gather = cm.hw.d2h[CopyMechanism.KERNEL_GATHER]
    assert price_store(cm, blocks) == pytest.approx(gather.seconds(blocks * (256 << 10)))
    # The runner's swap path, as calibrated, is not what a move is priced at: a calibration
    # whose swap curve is ten times slower leaves the price as it is.
    swap_out, _ = cm.copy_costs()
    slower = replace(swap_out, alpha_s_per_byte=10 * swap_out.alpha_s_per_byte)
    slow = CostModel(cm.mc, cm.hw, replace(cm.calib, copy_out=slower), cm.config)
    assert slow.copy_costs()[0] == slower
    assert price_store(slow, blocks) == price_store(cm, blocks)
