"""Scoring the simulator against a recorded real run (the `sim` phase of fidelity_report.py):
replay the trace in the simulator, predict every real step, compare."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from benchmarks.fidelity_report import engine_args, load_requests, request_rows
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import engine_summary, summarize_run
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel
from kvtier.costmodel.recording import StepRecord
from kvtier.sim.engine import build_sim_engine
from kvtier.sim.factory import sim_pool_sizes

FIGURES = {  # summary key path -> name in the report
    ("request_throughput",): "request_throughput",
    ("output_throughput",): "output_throughput",
    ("ttft_s", "p50"): "ttft_p50",
    ("ttft_s", "p90"): "ttft_p90",
    ("tpot_s", "p50"): "tpot_p50",
    ("tpot_s", "p90"): "tpot_p90",
    ("e2e_s", "p50"): "e2e_p50",
}


def figure(summary: dict, path: tuple[str, ...]) -> float | None:
    v = summary
    for k in path:
        v = v.get(k) if isinstance(v, dict) else None
    return v


def step_kind(cm: CostModel, rec: StepRecord) -> str:
    kind = rec.shape.kind
    if kind == "decode":
        return "decode_graph" if cm.graph_batch(rec.shape) is not None else "decode_eager"
    return kind


def score_steps(cm: CostModel, records: list[StepRecord]) -> dict:
    """Executor-time error per step kind, and the loop period (execute start to the next
    execute start) against the predicted executor + loop time."""
    by_kind: dict[str, list[tuple[float, float]]] = defaultdict(list)
    periods = []
    for i, rec in enumerate(records):
        cost = cm.predict(rec.shape)
        by_kind[step_kind(cm, rec)].append((cost.executor_s, rec.execute_s))
        if i + 1 < len(records):
            periods.append((cost.total_s, records[i + 1].start_s - rec.start_s))
    out = {k: _errors(v) for k, v in sorted(by_kind.items())}
    out["all"] = _errors([p for v in by_kind.values() for p in v])
    out["prefill_or_mixed"] = _errors(by_kind.get("mixed", []) + by_kind.get("prefill", []))
    out["loop_period"] = _errors(periods)
    return out


def _errors(pairs: list[tuple[float, float]]) -> dict:
    if not pairs:
        return {"count": 0}
    p, t = np.array(pairs).T
    rel = (p - t) / t
    return {"count": len(t), "mape": float(np.mean(np.abs(rel))),
            "median_ape": float(np.median(np.abs(rel))), "p90_ape": float(np.percentile(np.abs(rel), 90)),
            "bias": float(np.mean(rel)), "total_time_error": float(p.sum() / t.sum() - 1),
            "mean_measured_s": float(t.mean())}


def simulate(real: dict, calib: Calibration):
    cfg, wl = real["config"], real["workload"]
    reqs = load_requests(wl["path"], wl["num_requests"], wl["rate"], wl["cv"], wl["seed"])
    engine = build_sim_engine(engine_args(cfg), "h200", calib, record_steps=True)
    clock = engine.clock
    result = run_workload(EngineBackend(engine, clock=clock), reqs, RunOptions(progress=False),
                          clock=clock)
    return engine, result


def summary_errors(real_summary: dict, sim_summary: dict) -> dict:
    errors = {}
    for path, name in FIGURES.items():
        r, s = figure(real_summary, path), figure(sim_summary, path)
        errors[name] = None if not r or s is None else (s - r) / r
    return errors


def latency_errors(real_rows: list[list], sim_rows: list[list], keep: list[int]) -> dict:
    """TTFT/TPOT percentile errors over the requests `keep` (rows of request_rows)."""
    out = {}
    for col, name in ((3, "ttft"), (4, "tpot")):
        r = [real_rows[i][col] for i in keep if real_rows[i][col] is not None]
        s = [sim_rows[i][col] for i in keep if sim_rows[i][col] is not None]
        for q in (50, 90):
            rq, sq = np.percentile(r, q), np.percentile(s, q)
            out[f"{name}_p{q}"] = float((sq - rq) / rq)
    out["num_requests"] = len(keep)
    return out


def score_report(real: dict, calib_path: str, real_path: str) -> dict:
    from benchmarks.fidelity_diagnostic import serving_host_diagnostic

    calib = Calibration.load(calib_path)
    engine, result = simulate(real, calib)
    cm: CostModel = engine.executor.cost_model
    steps = [StepRecord.from_json(r) for r in real["steps"]]
    sim_summary = summarize_run(result).to_dict()
    own = sim_pool_sizes(replace_blocks(engine_args(real["config"])).create_engine_config(),
                         get_hardware("h200"), 1, calib)
    return {
        "real_run": real_path, "calibration": calib_path, "config": real["config"],
        "workload": real["workload"],
        "errors": summary_errors(real["summary"], sim_summary),
        "step_time": score_steps(cm, steps),
        "diagnostic_serving_host_fit": serving_host_diagnostic(real, calib, cm),
        "real": {"summary": real["summary"], "engine": real["engine"]},
        "sim": {"summary": sim_summary, "engine": engine_summary(result),
                "requests": request_rows(result)},
        "pool_blocks": {"real": real["config"]["num_gpu_blocks"], "sim_estimate": own.num_gpu_blocks},
    }


def replace_blocks(args):
    from dataclasses import replace

    return replace(args, num_gpu_blocks=None, num_host_blocks=None)
