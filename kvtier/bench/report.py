"""The result directory: result.json, per-request and per-step CSVs per policy, the PNGs.

result.json is self-describing (command, commit, hardware, configuration, workload, every
metric per policy, and each policy's metrics as ratios to the first policy's).
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, fields
from pathlib import Path

from kvtier.bench.environment import environment
from kvtier.bench.experiment import PolicyResult
from kvtier.bench.extras import can_plot
from kvtier.bench.gpu_monitor import GpuSummary
from kvtier.bench.runner import RunResult
from kvtier.bench.workload import Workload
from kvtier.engine.outputs import EngineStats

_REQUEST_COLUMNS = (
    "request_id", "prompt_len", "expected_output_len", "output_len", "arrival_s", "first_token_s",
    "finish_s", "ttft_s", "tpot_s", "e2e_s", "finish_reason", "num_preemptions", "error",
    "num_cached_tokens", "queue_s",
)


def policy_dict(result: PolicyResult) -> dict:
    out_tokens = sum(r.output_len for r in result.run.records if r.ok)
    return {
        "summary": result.summary.to_dict(),
        "engine": result.engine,
        "gpu": result.run.gpu.to_dict(out_tokens) if result.run.gpu else None,
        "goodput": result.goodput.to_dict() if result.goodput else None,
        "max_submit_lag_s": result.run.max_submit_lag_s,
    }


def flatten(d: dict, prefix: str = "") -> dict[str, float]:
    """Numeric leaves as dotted keys ("summary.ttft_s.p50"); lists are left out."""
    flat: dict[str, float] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, name + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[name] = float(value)
    return flat


def ratios(first: dict, other: dict) -> dict[str, float | None]:
    """other / first for every metric both have; None where the first is 0 (no ratio)."""
    a, b = flatten(first), flatten(other)
    return {k: (b[k] / a[k] if a[k] != 0 and math.isfinite(a[k]) else None) for k in a if k in b}


def write_requests_csv(run: RunResult, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(_REQUEST_COLUMNS)
        for r in run.records:
            w.writerow([r.request_id, r.prompt_len, r.expected_output_len, r.output_len, r.arrival_s,
                        r.first_token_s, r.finish_s, r.ttft_s, r.tpot_s, r.e2e_s, r.finish_reason,
                        r.num_preemptions, r.error or "",
                        "" if r.num_cached_tokens is None else r.num_cached_tokens,
                        "" if r.queue_s is None else r.queue_s])


def write_steps_csv(run: RunResult, path: Path) -> None:
    names = [f.name for f in fields(EngineStats)]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", *names])
        for s in run.steps:
            stats = asdict(s.stats)
            w.writerow([s.t_s, *(stats[n] for n in names)])


def write_gpu_csv(gpu: GpuSummary, path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "gpu_util_pct", "mem_used_bytes", "power_w", "sm_clock_mhz"])
        for g in gpu.samples:
            w.writerow([g.t_s, g.gpu_util_pct, g.mem_used_bytes, g.power_w, g.sm_clock_mhz])


def write_plots(results: list[PolicyResult], out: Path) -> dict[str, str]:
    """The PNGs (matplotlib, from the [bench] extra); none without it."""
    if not can_plot():
        return {}
    from kvtier.bench import plots

    runs = {r.policy: r.run for r in results}
    files = {
        "latency_cdf": plots.plot_latency_cdfs(runs, out / "latency_cdf.png"),
        "timeseries": plots.plot_timeseries(runs, out / "kv_and_running.png"),
    }
    sweeps = {r.policy: r.goodput for r in results if r.goodput is not None}
    if sweeps:
        files["load_sweep"] = plots.plot_load_sweep(sweeps, out / "load_sweep.png")
    return {k: v.name for k, v in files.items()}


def write_result_dir(out: Path, results: list[PolicyResult], workload: Workload,
                     config: dict, command: str) -> Path:
    """Everything about one benchmark under `out`; returns the path of result.json."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict = {"plots": write_plots(results, out), "requests": {}, "steps": {}}
    for r in results:
        files["requests"][r.policy] = f"requests_{r.policy}.csv"
        files["steps"][r.policy] = f"steps_{r.policy}.csv"
        write_requests_csv(r.run, out / files["requests"][r.policy])
        write_steps_csv(r.run, out / files["steps"][r.policy])
        if r.run.gpu is not None:
            files.setdefault("gpu", {})[r.policy] = f"gpu_{r.policy}.csv"
            write_gpu_csv(r.run.gpu, out / files["gpu"][r.policy])
    policies = {r.policy: policy_dict(r) for r in results}
    first = results[0].policy
    doc = {
        "command": command,
        **environment(),
        "config": config,
        "workload": {"spec": workload.spec.to_dict(), **workload.summary()},
        "policies": policies,
        "baseline_policy": first,
        "ratios_vs_first": {p: ratios(policies[first], d) for p, d in policies.items() if p != first},
        "files": files,
    }
    path = out / "result.json"
    path.write_text(json.dumps(doc, indent=2, default=str))
    return path
