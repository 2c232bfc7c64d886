"""A synthetic calibration: operator curves from the H200 roofline at a known efficiency and
known host parameters, so fits and predictions can be checked against exact values."""

from __future__ import annotations

from kvtier.config import ModelConfig
from kvtier.costmodel.calibration import Calibration, HostParams, LoopParams, PrefillFit, model_dims
from kvtier.costmodel.hardware import CopyCost, get_hardware
from kvtier.costmodel.operators import Shapes, attn_decode, gemm, head_ops, layer_elementwise
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import preset_config

MODEL = "llama-2-13b"
HOST = HostParams(graph_s=0.4e-3, graph_s_per_req=3e-6, eager_s=0.7e-3, eager_s_per_req=4e-6,
                  eager_s_per_token=0.1e-6, launch_s=7e-6)
ROWS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256, 512, 1024, 2048, 4096, 8192]
EFF, FLOOR = 0.8, 3e-6


def model_config() -> ModelConfig:
    # The preset as the loader resolves it, without the loader (torch): the pricing tests
    # also run where torch is blocked (test_torch_free.py).
    return model_config_from_hf(preset_config(MODEL), name=MODEL)


def _t(op) -> float:
    return get_hardware("h200").roofline_s(op.flops, op.bytes) / EFF + FLOOR


def raw_measurements(steps: list[dict] | None = None) -> dict:
    mc = model_config()
    s = Shapes.of(mc)
    dims = s.gemm_dims()
    return {
        "meta": {"hardware": "h200", "model": MODEL, "hf_config": preset_config(MODEL),
                 "model_dims": model_dims(mc), "max_model_len": 4096, "max_num_seqs": 256,
                 "max_num_batched_tokens": 8192, "block_bytes": 2 * 4 * 16 * 5120 * 2,
                 "cuda_graphs": True},
        "gemm": {n: [[m, _t(gemm(n, m, *dims[n], 2))] for m in ROWS] for n in dims},
        "elementwise": [[t, _t(layer_elementwise(s, t))] for t in ROWS],
        "head_elementwise": [[t, sum(_t(o) for o in head_ops(s, t, 0))] for t in ROWS],
        "sample": [[r, _t(head_ops(s, 0, r)[3]) + 20e-6] for r in ROWS[:14]],
        "attn_decode_graph": [[b, c, _t(attn_decode(s, b, b * c))]
                              for b in (1, 4, 16, 64, 256) for c in (64, 512, 4096)],
        "attn_decode_eager": [[b, c, 1.1 * _t(attn_decode(s, b, b * c))]
                              for b in (1, 4, 16, 64, 256) for c in (64, 512, 4096)],
        "attn_prefill": [[[[n, 0]], 5e-6 + 2e-15 * 4 * 40 * 128 * n * (n + 1) / 2 + 1e-9 * n]
                         for n in (16, 128, 1024, 4096)],
        "copies": {"out": [[n, 30e-6 + n * 1310720 / 20e9] for n in (1, 16, 256)],
                   "in": [[n, 20e-6 + n * 1310720 / 25e9] for n in (1, 16, 256)]},
        "loop": [[r, r, 150e-6 + 12e-6 * r] for r in (1, 16, 64, 256)],
        "steps": steps or [],
    }


def calibration() -> Calibration:
    raw = raw_measurements()
    return Calibration(
        hardware="h200", model=MODEL, model_dims=raw["meta"]["model_dims"], max_model_len=4096,
        **Calibration.measured_curves(raw), attn_prefill=PrefillFit(5e-6, 2e-15, 1e-9), host=HOST,
        loop=LoopParams(150e-6, 6e-6, 6e-6), copy_out=CopyCost(1 / 20e9, 30e-6),
        copy_in=CopyCost(1 / 25e9, 20e-6), raw=raw)
