"""Where the cost model misses mixed steps: error by token count of a fidelity trace.

  PYTHONPATH=. python benchmarks/fidelity_mixed_bins.py \
      --real benchmarks/results/fidelity_real_h200.json \
      --calibration benchmarks/results/calib_h200_llama-2-13b.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.fidelity_scoring import simulate, step_kind
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.recording import StepRecord

EDGES = (0, 300, 400, 500, 700, 1000, 1 << 30)


def bins(real: dict, calib: Calibration) -> list[dict]:
    engine, _ = simulate(real, calib)
    cm = engine.executor.cost_model
    rows = []
    for r in (StepRecord.from_json(x) for x in real["steps"]):
        if step_kind(cm, r) == "mixed":
            rows.append((r.shape.num_tokens, cm.predict(r.shape).executor_s, r.execute_s))
    out = []
    for lo, hi in zip(EDGES, EDGES[1:]):
        sel = [x for x in rows if lo <= x[0] < hi]
        if not sel:
            continue
        p, t = np.array([x[1] for x in sel]), np.array([x[2] for x in sel])
        rel = (p - t) / t
        out.append({"tokens": [lo, hi], "steps": len(sel), "mape": float(np.mean(abs(rel))),
                    "median_ape": float(np.median(abs(rel))), "bias": float(np.mean(rel)),
                    "median_measured_ms": float(np.median(t) * 1e3),
                    "median_predicted_ms": float(np.median(p) * 1e3)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True)
    ap.add_argument("--calibration", required=True)
    args = ap.parse_args()
    for row in bins(json.load(open(args.real)), Calibration.load(args.calibration)):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
