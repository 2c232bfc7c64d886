"""Every committed fidelity trace of the H200 (issue 6), scored with the calibration of its
own commit and with the newest one: how much of the simulator's error is the model and how
much is the lease (host speed and GPU step times differ between machines of one kind).

  python -m benchmarks.fidelity.fidelity_runs \
      --workload .carry/sharegpt_llama2-13b_1000.json \
      --out results/fidelity/fidelity_h200_runs.json

Each trace is `benchmarks/fidelity/fidelity_report.py real` on the H200 (the device calls are
`benchmarks/device_runs.sh`'s fidelity parts); each calibration is refit in memory from its raw
measurements with this commit's fit first; scoring runs the simulator on this CPU (~8 s a
pair).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from benchmarks.common import write_result
from benchmarks.fidelity.fidelity_report import score_report
from kvtier.costmodel.calibration import Calibration
from kvtier.profiler.fit import fit_calibration

TRACES = Path("results/fidelity")
CALIBRATIONS = Path("results/calibration")
NEWEST = "calib_h200_llama-2-13b.json"
# (what changed in the engine, trace, the calibration profiled on the same code or nearest)
RUNS = [
    ("a7ccf36: warm-up steps (session 4 headline)", "fidelity_real_h200_a7ccf36.json",
     "calib_h200_llama-2-13b_a7ccf36.json"),
    ("e21742a: gc.freeze, LM head padded", "fidelity_real_h200_gcfreeze.json",
     "calib_h200_llama-2-13b_a7ccf36.json"),
    ("b9e1d05: host issue times recorded", "fidelity_real_h200_issue_times.json",
     "calib_h200_llama-2-13b_a7ccf36.json"),
    ("1d36a22: attention's host path trimmed", "fidelity_real_h200_host_trim.json",
     "calib_h200_llama-2-13b_1d36a22.json"),
    ("f08c20d: allocator probe each step", "fidelity_real_h200_alloc_probe.json",
     "calib_h200_llama-2-13b_1d36a22.json"),
    ("f08c20d: probe, expandable segments", "fidelity_real_h200_expandable.json",
     "calib_h200_llama-2-13b_1d36a22.json"),
    ("34ab033: trace and calibration in one lease", "fidelity_real_h200.json", NEWEST),
]


def refit(calibration: str, into: Path) -> str:
    """The calibration refit from its raw measurements with today's fit, so both columns
    differ only in what was measured (the committed files keep the fit they were made with)."""
    path = into / calibration
    if not path.exists():  # once per calibration, however many traces it scores
        old = Calibration.load(CALIBRATIONS / calibration)
        fit_calibration(old.raw, old.environment).save(path)
    return str(path)


def score(trace: str, calibration: str, workload: str | None, into: Path) -> dict:
    real = json.loads((TRACES / trace).read_text())
    if workload:
        real["workload"]["path"] = workload
    report = score_report(real, refit(calibration, into), str(TRACES / trace))
    st, err = report["step_time"], report["errors"]
    return {"trace": trace, "calibration": calibration, "steps": st["all"]["count"],
            "mape_all": st["all"]["mape"], "mape_decode": st["decode_graph"]["mape"],
            "mape_mixed": st["mixed"]["mape"], "loop_period_bias": st["loop_period"]["bias"],
            **{k: err[k] for k in ("output_throughput", "ttft_p50", "ttft_p90", "tpot_p50",
                                   "tpot_p90")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", help="the prepared workload, if not at the traces' path")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    rows = []
    into = Path(tempfile.mkdtemp(prefix="kvtier_refit_"))
    for change, trace, own in RUNS:
        for calibration in dict.fromkeys([own, NEWEST]):
            row = {"run": change, **score(trace, calibration, args.workload, into)}
            rows.append(row)
            print(f"{change:45s} {calibration:38s} mixed {row['mape_mixed']:.3f} "
                  f"thr {row['output_throughput']:+.3f} ttft {row['ttft_p50']:+.3f} "
                  f"tpot {row['tpot_p50']:+.3f}", flush=True)
    write_result(args.out, {"runs": rows, "targets": {
        "mape_mixed": 0.05, "output_throughput": 0.05, "tpot_p50": 0.05, "ttft_p50": 0.10}})


if __name__ == "__main__":
    main()
