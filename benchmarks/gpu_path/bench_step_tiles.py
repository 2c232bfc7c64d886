"""Decode steps (llama-3.1-8b; the issue-3 step is 256 requests at context 2048) under the
H200's 700 W cap, by the decode attention's launch shape.

Why: every H200 runs this step at its power cap, and the clock the cap leaves sets the
compute-bound 256-row GEMMs' time. The attention streams the KV at HBM speed whatever its
tile, but its tiles, warps and pipeline stages change the work (and so the power) its SMs
spend per byte. A launch shape that is no slower alone but draws less would leave the GEMMs
a higher clock. Graph-timed kernels alone do not show that: only the whole step at the cap
does, so this captures the step's graph once per launch shape and replays them in
alternating rounds (the board warms as it runs), with the SM clock and board power.

Usage (GPU):
  python -m benchmarks.gpu_path.bench_step_tiles --out results/gpu_path/step_tiles_h200.json
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import asdict

import torch

from benchmarks.common import median_replay_s, monitored, write_result
from benchmarks.gpu_path.bench_gpu_path import decode_bytes, decode_step_engine, release, roofline
from kvtier.engine.llm_engine import LLMEngine
from kvtier.kernels import paged_decode_launch as launch
from kvtier.kernels.paged_decode_launch import DecodeTiles

# The first sweep (step_tiles_h200_a29859d.json): at 256 x 2048, 2 warps held a higher clock
# than the default 4 at equal bandwidth, 2 stages a much higher one at lower bandwidth. So:
# the default first, then fewer warps at 3-4 stages and the larger tiles at fewer warps.
VARIANTS = (
    DecodeTiles(64, 4, 3),
    DecodeTiles(64, 2, 3),
    DecodeTiles(64, 2, 4),
    DecodeTiles(64, 1, 3),
    DecodeTiles(64, 1, 4),
    DecodeTiles(32, 1, 4),
    DecodeTiles(128, 2, 2),
    DecodeTiles(128, 4, 3),
)


def capture_step(engine: LLMEngine, batch: int, tiles: DecodeTiles) -> torch.cuda.CUDAGraph:
    """The decode graph of `batch` rows with the attention launched at `tiles` (the
    runner's own capture path, into the graphs' shared pool)."""
    graphs = engine.executor.graphs
    default = launch.default_tiles
    launch.default_tiles = lambda *args: tiles  # what `tiles_for` asks, at capture time
    try:
        with torch.inference_mode():
            graphs._forward(batch)  # compiles outside the capture
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=graphs.pool):
                graphs._forward(batch)
    finally:
        launch.default_tiles = default
    torch.cuda.synchronize()
    return graph


def parse_variants(text: str) -> tuple[DecodeTiles, ...]:
    """Launch shapes from "block_n:num_warps:num_stages,...", e.g. "64:4:3,64:2:4" (the first
    is the baseline)."""
    return tuple(DecodeTiles(*(int(x) for x in v.split(":"))) for v in text.split(","))


def run(batch: int, context: int, kv_gb: float, rounds: int, replays: int,
        variants: tuple[DecodeTiles, ...] = VARIANTS) -> dict:
    engine = decode_step_engine("llama-3.1-8b", batch, context, kv_gb)
    graphs = {v: capture_step(engine, batch, v) for v in variants}
    for g in graphs.values():  # warm: the board reaches its capped clock
        for _ in range(5):
            g.replay()
    torch.cuda.synchronize()
    wb, kvb = decode_bytes(engine.model_config, batch, context)
    hbm_s, _ = roofline(wb, kvb, batch)
    samples: dict[DecodeTiles, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        order = variants if r % 2 == 0 else tuple(reversed(variants))
        for v in order:
            s, gpu = monitored(lambda g=graphs[v]: median_replay_s(g, replays))
            samples[v].append({"step_ms": s * 1e3, "gpu": gpu})
            print(v, round(s * 1e3, 3), gpu, flush=True)
    release(engine)
    rows = []
    for v, runs in samples.items():
        ms = statistics.median(x["step_ms"] for x in runs)
        clocks = [x["gpu"]["sm_clock_mhz"] for x in runs if x["gpu"]]
        power = [x["gpu"]["power_w"] for x in runs if x["gpu"]]
        rows.append({"tiles": asdict(v), "step_ms": ms, "fraction_of_roofline": hbm_s * 1e3 / ms,
                     "sm_clock_mhz": statistics.mean(clocks) if clocks else None,
                     "power_w": statistics.mean(power) if power else None, "rounds": runs})
    return {"model": "llama-3.1-8b", "batch": batch, "context": context,
            "roofline_ms": hbm_s * 1e3, "baseline": asdict(variants[0]), "variants": rows}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--kv-gb", type=float, default=80.0)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--replays", type=int, default=40)
    ap.add_argument("--shapes", default="256x2048,64x2048,16x8192",
                    help="batch x context, comma-separated")
    ap.add_argument("--variants", default=None,
                    help="block_n:num_warps:num_stages, comma-separated, the baseline first")
    args = ap.parse_args()
    os.environ["KVTIER_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    rows = []
    for shape in args.shapes.split(","):
        batch, context = (int(x) for x in shape.split("x"))
        variants = parse_variants(args.variants) if args.variants else VARIANTS
        rows.append(run(batch, context, args.kv_gb, args.rounds, args.replays, variants))
        write_result(args.out, {"step_tiles": rows})  # after every shape


if __name__ == "__main__":
    main()
