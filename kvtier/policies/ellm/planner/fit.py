"""The planner's roofline, fitted to the calibrated cost model.

The planner needs a smooth T(b, r) that SLSQP can differentiate; the cost model
(kvtier/costmodel) is the accurate one — calibrated operator curves, graph vs piecewise
steps, launch costs — but piecewise and too slow to call inside a solve. So the planner keeps
its roofline form and takes four constants from the cost model: the fraction of the FLOP and
bandwidth ceilings its steps reach, a fixed per-step overhead, and the extra cost of a step
that recomputes any prefix. With the probe ceilings alone, recomputation below the ridge
point looks free and the planner drops KV to grow the batch; the calibrated model says a
recomputed token costs time on every step (results/sim/sim_paper/physics_h200.json).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from scipy.optimize import least_squares

from kvtier.config import ModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner

BATCHES = (8, 32, 64, 128, 256)
CONTEXTS = (256, 512, 1024, 2048)
RATIOS = (0.0, 0.05, 0.1, 0.25, 0.5)


def decode_shape(b: int, s: int, r: float) -> StepShape:
    """A decode step of b requests of context s whose first r*s tokens are recomputed (one
    prefill row each, as the runner batches eLLM's prefixes)."""
    k = int(round(s * r))
    prefills = ((k, 0),) * b if k else ()
    return StepShape(num_decodes=b, decode_ctx_sum=b * s, decode_ctx_max=s, prefills=prefills,
                     num_sampled=b)


def sample_points(cost_model, max_batch: int, max_tokens: int) -> list[tuple[int, int, float, float]]:
    """(b, s, r, predicted step seconds incl. the engine loop) over the grid, skipping steps
    the scheduler could not form (more tokens than a step's budget)."""
    rows = []
    for b in (x for x in BATCHES if x <= max_batch):
        for s in CONTEXTS:
            for r in RATIOS:
                if b * (1 + s * r) > max_tokens:
                    continue
                rows.append((b, s, r, cost_model.predict(decode_shape(b, s, r)).total_s))
    return rows


def fit_to_cost_model(model: ModelConfig, cfg: PlannerConfig, cost_model,
                      max_tokens: int = 8192) -> PlannerConfig:
    """`cfg` with flops/hbm efficiency, step overhead and recompute overhead fitted (least
    squares on relative error) to the cost model's decode steps."""
    rows = sample_points(cost_model, cfg.max_batch, max_tokens)
    if len(rows) < 4:
        return cfg
    pts = np.array(rows)

    def config_of(x: np.ndarray) -> PlannerConfig:
        return replace(cfg, flops_efficiency=float(x[0]), hbm_efficiency=float(x[1]),
                       step_overhead_s=float(x[2]), recompute_overhead_s=float(x[3]))

    def residuals(x: np.ndarray) -> np.ndarray:
        p = RequestLevelPlanner(model, config_of(x))
        pred = np.array([p.step_time(b, r, s) for b, s, r, _ in pts])
        return pred / pts[:, 3] - 1.0

    x0 = np.array([0.8, 0.8, cfg.step_overhead_s, 1e-3])
    fit = least_squares(residuals, x0, bounds=([0.05, 0.05, 0.0, 0.0], [1.0, 1.0, 0.1, 0.1]))
    return config_of(fit.x)
