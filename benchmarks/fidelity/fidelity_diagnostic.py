"""A diagnostic, not the headline: how close the simulator gets when its host parameters
come from serving steps rather than from `kvtier profile`'s back-to-back step sweeps.

The first half of the real trace's steps plays the part of a serving calibration (the same
fit `kvtier profile --serve-requests` makes on its own synthetic trace); the cost model is
scored on the second half, and latencies only over requests that arrived after the split.
The trace itself is the same workload, so this bounds what such a calibration can do; it
does not replace a held-out run.
"""

from __future__ import annotations

from dataclasses import replace

from benchmarks.fidelity.fidelity_scoring import latency_errors, score_steps, summary_errors
from benchmarks.fidelity.fidelity_trace import request_rows, simulate
from kvtier.bench.metrics import summarize_run
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.model import CostModel
from kvtier.profiler.host_fit import fit_host
from kvtier.profiler.recording import StepRecord


def serving_host_diagnostic(real: dict, calib: Calibration, cm: CostModel) -> dict:
    records = [StepRecord.from_json(r) for r in real["steps"]]
    half = len(records) // 2
    fit_steps = [{"shape": r.shape.to_json(), "wall_s": r.execute_s, "issue_s": None}
                 for r in records[:half]]

    def make(c: Calibration) -> CostModel:
        return CostModel(cm.mc, cm.hw, c, cm.config)

    host, fit_report = fit_host(calib, make, fit_steps)
    refit = replace(calib, host=host)
    engine, result = simulate(real, refit)
    split_s = records[half].start_s - records[0].start_s
    late = [i for i, row in enumerate(real["requests"]) if row[2] >= split_s]
    return {
        "host_fitted_on": f"the trace's first {half} steps (wall times only)",
        "host": host.__dict__, "fit": fit_report,
        "held_out_steps": score_steps(engine.executor.cost_model, records[half:]),
        "errors_all_requests": summary_errors(real["summary"], summarize_run(result).to_dict()),
        "latency_errors_late_requests": latency_errors(real["requests"], request_rows(result), late),
        "split_s": split_s,
        "requests": request_rows(result),
    }
