"""How well the eLLM planner's roofline T(b, r) matches the calibrated cost model, before and
after fitting its constants to it (kvtier/policies/ellm/planner/fit.py).

  python -m benchmarks.planner.bench_planner_fit \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --out results/planner/planner_fit.json
"""

from __future__ import annotations

import argparse
from dataclasses import asdict

import numpy as np

from benchmarks.common import write_result
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import preset_config
from kvtier.policies.ellm.planner.fit import fit_to_cost_model, sample_points
from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-2-13b")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    mc = model_config_from_hf(preset_config(args.model))
    hw = get_hardware("h200")
    cm = CostModel(mc, hw, Calibration.load(args.calibration),
                   CostModelConfig(max_num_seqs=args.max_num_seqs, piecewise_graphs=True))
    probe = PlannerConfig(hbm_bytes_per_s=hw.hbm_bytes_per_s, bf16_flops=hw.bf16_flops,
                          kv_budget_bytes=40 << 30, tpot_slo_s=0.1, max_batch=args.max_num_seqs)
    fitted = fit_to_cost_model(mc, probe, cm)
    rows = sample_points(cm, args.max_num_seqs, 8192)

    def mape(cfg: PlannerConfig) -> float:
        p = RequestLevelPlanner(mc, cfg)
        return float(np.mean([abs(p.step_time(b, r, s) / t - 1) for b, s, r, t in rows]))

    result = {"model": args.model, "calibration": args.calibration, "points": len(rows),
              "mape_probe_ceilings": mape(probe), "mape_fitted": mape(fitted),
              "fitted": {k: v for k, v in asdict(fitted).items()
                         if k in ("flops_efficiency", "hbm_efficiency", "step_overhead_s",
                                  "recompute_overhead_s")}}
    print(result)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
