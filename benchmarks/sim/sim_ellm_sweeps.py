"""eLLM's sweeps on the simulator (the cost model's view of today's engine, issue 7):

  ratio      fixed uncached ratio r = 0 (recompute policy) .. 0.9: throughput, TTFT, TPOT;
  adaptive   the default mode (on-demand drops) under each --ellm-recompute-budget rule: max
             (max_recompute_tokens = 4,096 a step, the old default), ridge (the ridge point
             minus the decodes, blind to the lost decode graph), auto (the calibrated cost
             model's price, the default);
  planner    --ellm-planner with its hardware constants scaled 0.8 / 1.0 / 1.2 (the paper's
             +-20 % robustness check) against the simulated H200.

  python -m benchmarks.sim.sim_ellm_sweeps --workload .carry/sharegpt_llama2_13b_1500.json \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --out results/sim/sim_ellm_sweeps.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec  # noqa: E402
from kvtier.bench.engine_backend import EngineBackend  # noqa: E402
from kvtier.bench.metrics import summarize_run  # noqa: E402
from kvtier.bench.prepared import load_prepared  # noqa: E402
from kvtier.bench.request import LengthLimits  # noqa: E402
from kvtier.bench.runner import RunOptions, run_workload  # noqa: E402
from kvtier.bench.workload import with_arrivals  # noqa: E402
from kvtier.costmodel.hardware import get_hardware  # noqa: E402
from kvtier.engine.args import EngineArgs  # noqa: E402
from kvtier.sim import VirtualClock, build_sim_engine  # noqa: E402


def run(args, engine_args: EngineArgs, requests, planner_scale: float | None = None) -> dict:
    clock = VirtualClock()
    planner_hw = None
    if planner_scale is not None:
        hw = get_hardware("h200")
        planner_hw = dataclasses.replace(hw, hbm_bytes_per_s=hw.hbm_bytes_per_s * planner_scale,
                                         bf16_flops=hw.bf16_flops * planner_scale)
    engine = build_sim_engine(engine_args, "h200", args.calibration, clock=clock,
                              planner_hardware=planner_hw)
    result = run_workload(EngineBackend(engine, ignore_eos=True, clock=clock), requests,
                          RunOptions(progress=False), clock=clock)
    s = summarize_run(result)
    stats = engine.get_stats()
    return {"output_tok_s": s.output_throughput, "ttft_p50_s": s.ttft_s.p50,
            "tpot_p50_s": s.tpot_s.p50, "preemptions": stats.num_preemptions_total,
            "prefix_recompute_tokens": stats.num_prefix_recompute_tokens_total}


def workload_parser() -> argparse.ArgumentParser:
    """The simulated eLLM experiments' common options: the prepared trace and its load."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--calibration", default=None)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--kv-cache-gb", type=float, default=40.0)
    ap.add_argument("--out", required=True)
    return ap


def load_requests(args: argparse.Namespace):
    """The trace's first --num-prompts requests, gamma arrivals at --rate (the paper's CV)."""
    reqs = load_prepared(args.workload, args.num_prompts, LengthLimits())
    return with_arrivals(reqs, ArrivalSpec(ArrivalKind.GAMMA, rate=args.rate, cv=1.6925), seed=0)


def main(argv: list[str] | None = None) -> None:
    args = workload_parser().parse_args(argv)
    reqs = load_requests(args)
    base = EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=2048,
                      kv_cache_gb=args.kv_cache_gb, swap_space=1, max_num_seqs=256)
    ratio = [{"uncached_ratio": 0.0, **run(args, base, reqs)}]
    print(ratio[-1], flush=True)
    for r in (0.1, 0.3, 0.5, 0.7, 0.9):
        # On-demand drops are capped at r too: every request keeps ~(1 - r) of its KV.
        a = dataclasses.replace(base, kv_policy="ellm", ellm_uncached_ratio=r,
                                ellm_max_uncached_ratio=r)
        ratio.append({"uncached_ratio": r, **run(args, a, reqs)})
        print(ratio[-1], flush=True)
    adaptive = []
    for rule in ("max", "ridge", "auto"):
        a = dataclasses.replace(base, kv_policy="ellm", ellm_recompute_budget=rule)
        adaptive.append({"recompute_budget": rule, **run(args, a, reqs)})
        print(adaptive[-1], flush=True)
    planner = []
    for scale in (0.8, 1.0, 1.2):
        a = dataclasses.replace(base, kv_policy="ellm", ellm_planner=True)
        planner.append({"planner_constants_scale": scale, **run(args, a, reqs, scale)})
        print(planner[-1], flush=True)
    payload = {"model": "llama-2-13b", "hardware": "h200 (simulated)",
               "calibration": args.calibration, "workload": args.workload,
               "num_prompts": len(reqs), "rate": args.rate, "kv_cache_gb": args.kv_cache_gb,
               "ratio_sweep": ratio, "adaptive_budget": adaptive,
               "planner_perturbation": planner}
    write_result(args.out, payload)
    fig, ax = plt.subplots(1, 3, figsize=(13, 3.6))
    xs = [r["uncached_ratio"] for r in ratio]
    for a, key, label in zip(ax, ("output_tok_s", "ttft_p50_s", "tpot_p50_s"),
                             ("output tok/s", "TTFT p50 (s)", "TPOT p50 (s)")):
        a.plot(xs, [r[key] for r in ratio], marker="o")
        a.set_xlabel("uncached ratio r (0 = recompute policy)")
        a.set_title(label)
    fig.suptitle("eLLM fixed cache-ratio sweep, llama-2-13b, simulated H200")
    fig.tight_layout()
    fig.savefig(Path(args.out).with_suffix(".png"), dpi=100)
    print(json.dumps(planner))


if __name__ == "__main__":
    main()
