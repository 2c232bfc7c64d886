"""Solve time of eLLM's request-level planner (target: p90 < 10 ms), over varied load.

  python -m benchmarks.planner.bench_planner --out results/planner/planner_solve_time.json
"""

from __future__ import annotations

import argparse
import random
import statistics

from benchmarks.common import write_result
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import preset_config
from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--solves", type=int, default=300)
    args = ap.parse_args()
    rng = random.Random(0)
    rows = []
    for model in ("llama-2-13b", "llama-3.1-8b"):
        m = model_config_from_hf(preset_config(model))
        times, ratios = [], []
        for _ in range(args.solves):
            p = RequestLevelPlanner(m, PlannerConfig(
                hbm_bytes_per_s=4.24e12, bf16_flops=761e12,
                kv_budget_bytes=rng.uniform(2, 80) * (1 << 30),
                tpot_slo_s=rng.uniform(0.02, 0.3), max_batch=256))
            contexts = [rng.randint(16, 4000) for _ in range(rng.randint(1, 400))]
            d = p.solve(contexts)
            times.append(d.solve_time_s)
            ratios.append(d.uncached_ratio)
        q = statistics.quantiles(times, n=10)
        rows.append({"model": model, "solves": len(times),
                     "solve_ms_p50": statistics.median(times) * 1e3, "solve_ms_p90": q[8] * 1e3,
                     "solve_ms_max": max(times) * 1e3,
                     "fraction_with_recompute": sum(r > 0.01 for r in ratios) / len(ratios)})
        print(rows[-1])
    write_result(args.out, {"planner": "SLSQP, 2 variables, 3 starts", "results": rows})


if __name__ == "__main__":
    main()
