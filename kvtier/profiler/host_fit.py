"""Host parameters of the cost model, fitted to whole-step wall times.

The device part of a step comes from the operator curves; what the host adds is fitted:

    graph steps   wall = graph_s + graph_s_per_req * B + device
                         + graph_s_per_tail_token * layers * (longest context - mean)
    eager steps   wall = eager_s + eager_s_per_req * B + eager_s_per_token * T
                         + launch queue (launch_s per kernel, device kernels behind it)
    piecewise     wall = the same eager_s terms (same input preparation)
                         + launch queue (attention wrappers, copies, graph replays: their
                           host costs measured by the profiler's host_launches sweep)

`launch_s` comes from measured issue times when there are some (the profiler's synthetic
steps; `piece_layer_s` likewise from their piecewise issue times), else it is searched on a
grid over the eager steps (steps recorded while serving have
only walls; with piecewise graphs on there may be none: the value given is kept). Steps off
by more than 4x after a first fit (a JIT compile, a GC pause) are dropped once.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from scipy.optimize import nnls

from kvtier.costmodel.calibration import Calibration, HostParams
from kvtier.costmodel.model import CostModel
from kvtier.costmodel.shape import StepShape

MakeModel = Callable[[Calibration], CostModel]
LAUNCH_STEP_S = 10e-6
LAUNCH_GRID_S = np.arange(0.0, 200e-6, LAUNCH_STEP_S)
_OUTLIER = 4.0


def _zero_terms(host: HostParams, launch_s: float) -> HostParams:
    return replace(host, graph_s=0.0, graph_s_per_req=0.0, graph_s_per_tail_token=0.0,
                   eager_s=0.0, eager_s_per_req=0.0, eager_s_per_token=0.0, launch_s=launch_s)


def _nnls_rel(a: np.ndarray, residual: np.ndarray, walls: np.ndarray) -> np.ndarray:
    """Non-negative terms for residual = wall - device time, rows weighted by 1/wall (the
    step's relative error, not the residual's)."""
    w = 1.0 / walls
    x, _ = nnls(a * w[:, None], residual * w)
    return x


class HostFitter:
    def __init__(self, calib: Calibration, make_model: MakeModel, shapes: list[StepShape],
                 walls: np.ndarray):
        self.calib, self.make_model = calib, make_model
        self.shapes, self.walls = shapes, walls
        cm = make_model(calib)
        self.graph = np.array([cm.graph_batch(s) is not None for s in shapes], bool)
        self.piecewise = np.array([not g and cm.piecewise_size(s) is not None
                                   for g, s in zip(self.graph, shapes)], bool)
        self.kernels_per_step = [
            cm.shapes.num_layers * len(cm.layer_kernels(s, s.num_tokens, False)) + 2
            for s in shapes]

    def terms(self, launch_s: float, keep: np.ndarray) -> HostParams:
        """Fit the linear host terms for a given launch cost on the steps in `keep`."""
        host = _zero_terms(self.calib.host, launch_s)
        base = self.predict(host, keep)
        g = np.flatnonzero(self.graph & keep)
        e = np.flatnonzero(~self.graph & keep)
        if len(g):
            cm = self.make_model(self.calib)
            a = np.array([[1.0, self.shapes[i].num_reqs,
                           cm.attention_tail_tokens(self.shapes[i])] for i in g])
            x = _nnls_rel(a, self.walls[g] - base[g], self.walls[g])
            host = replace(host, graph_s=float(x[0]), graph_s_per_req=float(x[1]),
                           graph_s_per_tail_token=float(x[2]))
        if len(e):
            a = np.array([[1.0, self.shapes[i].num_reqs, self.shapes[i].num_tokens] for i in e])
            x = _nnls_rel(a, self.walls[e] - base[e], self.walls[e])
            host = replace(host, eager_s=float(x[0]), eager_s_per_req=float(x[1]),
                           eager_s_per_token=float(x[2]))
        return host

    def predict(self, host: HostParams, mask: np.ndarray | None = None) -> np.ndarray:
        """Predicted executor times (NaN outside `mask`)."""
        cm = self.make_model(replace(self.calib, host=host))
        return np.array([cm.predict(s).executor_s if mask is None or mask[i] else np.nan
                         for i, s in enumerate(self.shapes)])

    def _eager_mape(self, launch_s: float, e: np.ndarray) -> float:
        pred = self.predict(self.terms(launch_s, e), e)
        return float(np.mean(np.abs(pred[e] - self.walls[e]) / self.walls[e]))

    def search_launch(self, keep: np.ndarray) -> float:
        """The launch cost whose fitted host terms give the eager steps the least MAPE:
        a coarse grid, then a fine one around its best point."""
        e = ~self.graph & ~self.piecewise & keep  # launch_s prices eager steps only
        if not e.any():
            return self.calib.host.launch_s
        coarse = min(LAUNCH_GRID_S, key=lambda c: self._eager_mape(float(c), e))
        fine = np.arange(max(0.0, coarse - LAUNCH_STEP_S), coarse + LAUNCH_STEP_S, 1e-6)
        return float(min(fine, key=lambda c: self._eager_mape(float(c), e)))


def fit_host(calib: Calibration, make_model: MakeModel, steps: list[dict]) -> tuple[HostParams, dict]:
    """Host parameters so that operator curves + host = the steps' wall times."""
    shapes = [StepShape.from_json(s["shape"]) for s in steps]
    walls = np.array([s["wall_s"] for s in steps], float)
    f = HostFitter(calib, make_model, shapes, walls)
    issue = [(st["issue_s"], n) for st, n, g in zip(steps, f.kernels_per_step, f.graph)
             if not g and st.get("issue_s")]
    keep = np.ones(len(steps), bool)
    for _ in range(2):  # fit, drop gross outliers, fit again
        launch = statistics.median(t / n for t, n in issue) if issue else f.search_launch(keep)
        host = f.terms(launch, keep)
        pred = f.predict(host)
        ratio = pred / walls
        keep = (ratio < _OUTLIER) & (ratio > 1 / _OUTLIER)
    rel = np.abs(pred - walls) / walls
    report = {"num_steps": len(steps), "dropped_outliers": int((~keep).sum()),
              "launch_from": "issue times" if issue else (
                  "grid search on walls" if (~f.graph & ~f.piecewise).any() else "given"),
              **_mapes(rel, f.graph, f.piecewise),
              **piecewise_issue_check(f.make_model(replace(calib, host=host)), steps)}
    return host, report


def _mapes(rel: np.ndarray, graph: np.ndarray, piecewise: np.ndarray) -> dict:
    eager = ~graph & ~piecewise
    return {"step_mape_all": float(rel.mean()),
            "step_mape_graph": float(rel[graph].mean()) if graph.any() else None,
            "step_mape_eager": float(rel[eager].mean()) if eager.any() else None,
            "step_mape_piecewise": float(rel[piecewise].mean()) if piecewise.any() else None}


def _issue_times(cm: CostModel, steps: list[dict]) -> list[tuple[float, float]]:
    """(the model's host time to issue the piecewise forward, the profiler's measured one)
    of every step that carries `issue_piecewise_s` and runs as pieces."""
    pairs = []
    for st in steps:
        if st.get("issue_piecewise_s"):
            shape = StepShape.from_json(st["shape"])
            t = cm.piecewise_size(shape)
            if t is not None:
                pairs.append((cm.piecewise_issue_seconds(shape, t), st["issue_piecewise_s"]))
    return pairs


def piecewise_issue_check(cm: CostModel, steps: list[dict]) -> dict:
    """The model's host chain of piecewise steps against the profiler's measured issue times
    (steps that carry `issue_piecewise_s`); empty when there are none."""
    pairs = _issue_times(cm, steps)
    if not pairs:
        return {}
    p, m = np.array(pairs).T
    return {"piecewise_issue_mape": float(np.mean(np.abs(p - m) / m)),
            "piecewise_issue_bias": float(np.mean((p - m) / m)),
            "piecewise_issue_steps": len(pairs)}


def piece_layer_s(calib: Calibration, make_model: MakeModel, steps: list[dict]) -> float | None:
    """HostParams.piece_layer_s from the profiler's measured issue times of piecewise forwards
    (steps carrying `issue_piecewise_s`): the median over steps of what the measured launch
    costs leave unexplained, per layer (never negative); None without such steps."""
    cm = make_model(replace(calib, host=replace(calib.host, piece_layer_s=0.0)))
    per = [(measured - modelled) / cm.shapes.num_layers
           for modelled, measured in _issue_times(cm, steps)]
    return max(0.0, statistics.median(per)) if per else None


def issue_launch_s(calib: Calibration, make_model: MakeModel, steps: list[dict]) -> float | None:
    """The eager launch cost from steps' measured eager issue times, or None without any."""
    cm = make_model(calib)
    per = [st["issue_s"] / (cm.shapes.num_layers * len(cm.layer_kernels(sh, sh.num_tokens, False)) + 2)
           for st in steps if st.get("issue_s")
           for sh in [StepShape.from_json(st["shape"])] if cm.graph_batch(sh) is None]
    return statistics.median(per) if per else None


def score_host(calib: Calibration, make_model: MakeModel, steps: list[dict]) -> dict:
    """MAPE of a calibration's predictions on other steps (no fitting)."""
    shapes = [StepShape.from_json(s["shape"]) for s in steps]
    walls = np.array([s["wall_s"] for s in steps], float)
    cm = make_model(calib)
    costs = [cm.predict(s) for s in shapes]
    pred = np.array([c.executor_s for c in costs])
    graph = np.array([c.graph for c in costs], bool)
    piecewise = np.array([c.piecewise for c in costs], bool)
    rel = np.abs(pred - walls) / walls
    return {"num_steps": len(steps), **_mapes(rel, graph, piecewise),
            **piecewise_issue_check(cm, steps)}
