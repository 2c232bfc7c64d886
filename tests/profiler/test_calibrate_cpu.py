"""`kvtier profile` end to end (tiny model, tiny sweeps) on the CPU path, and once on the GPU:
every sweep runs through the real runner, the fit succeeds, and the calibration loads into a
cost model."""

import argparse

import pytest
import torch

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel
from kvtier.costmodel.shape import StepShape
from kvtier.model.loader import resolve_model_config
from kvtier.profiler.calibrate import add_profile_parser, main


def test_profile_parser_plugs_into_a_cli():
    parser = argparse.ArgumentParser()
    add_profile_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["profile", "llama-2-13b", "--out", "c.json"])
    assert args.max_model_len == 4096 and args.load_format == "dummy" and callable(args.func)


def test_profile_tiny_model_on_cpu(tmp_path):
    out = tmp_path / "calib.json"
    rc = main(["tiny-llama", "--out", str(out), "--hardware", "h200", "--quick", "--device", "cpu",
               "--loop-requests", "40", "--serve-requests", "6", "--num-gpu-blocks", "256", "--max-model-len", "256",
               "--max-num-batched-tokens", "256", "--max-num-seqs", "8"])
    assert rc == 0
    calib = Calibration.load(out)
    assert set(calib.gemm) == {"qkv", "o", "gate_up", "down", "lm_head"}
    assert calib.attn_decode_graph.rows and calib.attn_decode_eager.rows
    assert calib.raw["steps"] and calib.raw["copies"]["out"] and calib.raw["loop"]
    assert calib.fit_report["host_fitted_on"] == "serving steps"
    assert calib.raw["meta"]["async_scheduling"] is False  # walls of one step each
    assert calib.fit_report["steps"]["num_steps"] == len(calib.raw["serving_steps"]) > 6
    assert calib.fit_report["sweep_steps_check"]["num_steps"] == len(calib.raw["steps"])
    assert calib.environment["torch"]
    mc, _ = resolve_model_config("tiny-llama", "dummy")
    cm = CostModel(mc, get_hardware("h200"), calib)
    cost = cm.predict(StepShape(num_decodes=4, decode_ctx_sum=200, decode_ctx_max=60,
                                prefills=((30, 0),), num_sampled=5))
    assert cost.executor_s > 0 and cost.loop_s > 0


def test_profile_records_piecewise_graphs_and_host_launches(tmp_path):
    """--piecewise-graphs reaches the runner (its pieces run eagerly on the CPU), the setting
    is recorded, and the host-launch sweep's figures become the piecewise host parameters."""
    out = tmp_path / "calib.json"
    rc = main(["tiny-llama", "--out", str(out), "--hardware", "h200", "--quick", "--device", "cpu",
               "--loop-requests", "0", "--serve-requests", "0", "--num-gpu-blocks", "256",
               "--max-model-len", "256", "--max-num-batched-tokens", "256",
               "--max-num-seqs", "8", "--piecewise-graphs"])
    assert rc == 0
    calib = Calibration.load(out)
    meta = calib.raw["meta"]
    assert meta["piecewise_graphs"] is True and meta["piecewise_captured"] is False
    launches = calib.raw["host_launches"]
    assert {"attn_decode_s", "attn_prefill_s", "attn_mixed_s", "op_s"} <= set(launches)
    assert calib.host.attn_decode_s == max(0.0, launches["attn_mixed_s"] - launches["attn_prefill_s"])
    assert calib.host.op_launch_s == launches["op_s"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_profile_tiny_model_on_gpu(tmp_path):
    """The GPU path's sweeps: Triton attention (rotary fused into its KV write, timed there),
    captured decode graphs and pieces, all the way to a calibration that loads."""
    out = tmp_path / "calib.json"
    rc = main(["tiny-llama", "--out", str(out), "--hardware", "h200", "--quick",
               "--loop-requests", "0", "--serve-requests", "0", "--num-gpu-blocks", "256",
               "--max-model-len", "256", "--max-num-batched-tokens", "256",
               "--max-num-seqs", "8", "--piecewise-graphs"])
    assert rc == 0
    calib = Calibration.load(out)
    assert calib.raw["meta"]["device"].startswith("cuda")
    assert calib.raw["meta"]["piecewise_captured"] is True
    assert calib.attn_decode_graph.rows and calib.attn_decode_eager.rows
    assert set(calib.gemm) == {"qkv", "o", "gate_up", "down", "lm_head"}
