"""The MLP's first half two ways: cuBLAS's gate_up projection then `silu_and_mul` (the
engine's unfused path), against the fused Triton kernel
(benchmarks/experiments/kernels/gate_up_silu.py)
at each of a set of launch shapes, per token count.

Each timing is a CUDA graph of 20 calls cycling over enough weight copies to miss the 60 MB
L2 (bench_kernels.time_graph), as a decode step reads each layer's weights once. Floor: the
larger of the bytes (weights, x, the product) at 4.24 TB/s and 2 * m * 2I * k at
761 TFLOP/s. The fused result is checked against the unfused one at every shape.

  python -m benchmarks.experiments.bench_gate_up_silu \
      --out results/experiments/gate_up_silu_h200.json
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from benchmarks.common import H200_BF16_FLOPS, H200_HBM_BYTES_PER_S, write_result
from benchmarks.experiments.kernels.gate_up_silu import GateUpTiles, gate_up_silu
from benchmarks.kernels.bench_kernels import copies_past_l2, time_graph
from kvtier.kernels.silu_and_mul import silu_and_mul
from kvtier.model.loader import resolve_model_config

TOKENS = (16, 64, 128, 192, 256, 384, 512, 768, 1024)
TILES = (
    GateUpTiles(64, 64, 64, 4, 4),
    GateUpTiles(64, 64, 128, 4, 3),
    GateUpTiles(64, 128, 64, 4, 4),
    GateUpTiles(64, 128, 64, 8, 4),
    GateUpTiles(128, 64, 64, 4, 4),
    GateUpTiles(128, 64, 64, 8, 4),
    GateUpTiles(128, 128, 64, 8, 3),
    GateUpTiles(256, 64, 64, 8, 3),
    GateUpTiles(128, 32, 64, 4, 4),
    GateUpTiles(64, 32, 128, 4, 4),
    GateUpTiles(32, 64, 128, 4, 4),
)


def floor_s(m: int, inter: int, k: int) -> float:
    moved = 2 * (2 * inter * k + m * k + m * inter)
    return max(moved / H200_HBM_BYTES_PER_S, 2.0 * m * 2 * inter * k / H200_BF16_FLOPS)


def tiles_name(t: GateUpTiles) -> str:
    return f"m{t.block_m}_h{t.block_h}_k{t.block_k}_w{t.num_warps}_s{t.num_stages}"


def bench_tokens(m: int, weights: list[torch.Tensor], inter: int, k: int) -> dict:
    x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
    floor = floor_s(m, inter, k)
    unfused = time_graph([lambda w=w: silu_and_mul(F.linear(x, w)) for w in weights])
    ref = silu_and_mul(F.linear(x, weights[0])).float()
    row: dict = {"m": m, "floor_us": floor * 1e6, "unfused_us": unfused * 1e6,
                 "unfused_of_floor": floor / unfused, "fused": {}}
    for t in TILES:
        out = gate_up_silu(x, weights[0], t).float()
        err = ((out - ref).norm() / ref.norm()).item()
        us = time_graph([lambda w=w, t=t: gate_up_silu(x, w, t) for w in weights]) * 1e6
        row["fused"][tiles_name(t)] = {"us": us, "of_floor": floor * 1e6 / us,
                                       "rel_err_vs_unfused": err}
    best = min(row["fused"], key=lambda n: row["fused"][n]["us"])
    row["best_fused"] = best
    row["best_fused_us"] = row["fused"][best]["us"]
    row["fused_speedup"] = unfused * 1e6 / row["best_fused_us"]
    print({key: v for key, v in row.items() if key != "fused"}, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gate_up_silu times GPU kernels: it needs a GPU")
    mc, _ = resolve_model_config(args.model, "dummy")
    inter, k = mc.intermediate_size, mc.hidden_size
    copies = copies_past_l2(2 * 2 * inter * k)
    weights = [torch.randn(2 * inter, k, dtype=torch.bfloat16, device="cuda") * 0.02
               for _ in range(copies)]
    rows = [bench_tokens(m, weights, inter, k) for m in args.tokens]
    write_result(args.out, {"model": args.model, "intermediate_size": inter, "hidden_size": k,
                            "tiles": [tiles_name(t) for t in TILES], "rows": rows})


if __name__ == "__main__":
    main()
