"""Plots of a fidelity report: predicted vs measured step times, TTFT and TPOT distributions,
completed requests over time, real against simulated."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.fidelity.fidelity_scoring import step_kind  # noqa: E402
from benchmarks.fidelity.fidelity_trace import engine_args  # noqa: E402
from kvtier.costmodel.calibration import Calibration  # noqa: E402
from kvtier.profiler.recording import StepRecord  # noqa: E402
from kvtier.sim.engine import build_sim_engine  # noqa: E402

_COLORS = {"decode_graph": "tab:blue", "decode_eager": "tab:cyan", "mixed": "tab:orange",
           "prefill": "tab:red", "copy_only": "tab:gray", "empty": "tab:gray"}


def _cdf(ax, values, label, style):
    v = np.sort([x for x in values if x is not None])
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), style, label=label)


def _steps_panel(ax, cm, records: list[StepRecord], step_time: dict) -> None:
    pts: dict[str, list[tuple[float, float]]] = {}
    for rec in records:
        pts.setdefault(step_kind(cm, rec), []).append((rec.execute_s, cm.predict(rec.shape).executor_s))
    for kind, p in sorted(pts.items()):
        a = np.array(p) * 1e3
        mape = step_time.get(kind, {}).get("mape")
        ax.scatter(a[:, 0], a[:, 1], s=4, alpha=0.5, color=_COLORS.get(kind, "k"),
                   label=f"{kind} (n={len(a)}, MAPE {mape:.1%})" if mape is not None else kind)
    lo = min(min(x for x, _ in p) for p in pts.values()) * 1e3
    hi = max(max(x for x, _ in p) for p in pts.values()) * 1e3
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="measured execute (ms)",
           ylabel="predicted (ms)", title="step time: cost model vs H200")
    ax.legend(fontsize=7)


def plot_fidelity(real: dict, calib: Calibration, records: list[StepRecord], sim_rows: list,
                  errors: dict, step_time: dict, what: str, path: str) -> None:
    """Four panels: step times of `records` predicted with `calib`, TTFT and TPOT CDFs and
    completions over time of the real run against `sim_rows`."""
    cm = build_sim_engine(engine_args(real["config"]), "h200", calib).executor.cost_model
    fig, axes = plt.subplots(2, 2, figsize=(11, 9))
    _steps_panel(axes[0, 0], cm, records, step_time)
    real_rows = real["requests"]
    for ax, col, name, key in ((axes[0, 1], 3, "TTFT (s)", "ttft_p50"),
                               (axes[1, 0], 4, "TPOT (s)", "tpot_p50")):
        _cdf(ax, [r[col] for r in real_rows], "real H200", "-")
        _cdf(ax, [r[col] for r in sim_rows], "simulated", "--")
        ax.set(xlabel=name, ylabel="fraction of requests",
               title=f"{name}: p50 error {errors[key]:+.1%}" if errors.get(key) is not None else name)
        ax.legend()
    ax = axes[1, 1]
    for rows, label, style in ((real_rows, "real H200", "-"), (sim_rows, "simulated", "--")):
        ends = np.sort([r[2] + r[5] for r in rows if r[5] is not None])
        ax.plot(ends, np.arange(1, len(ends) + 1), style, label=label)
    ax.set(xlabel="time since start (s)", ylabel="completed requests",
           title=f"throughput error {errors['request_throughput']:+.1%}")
    ax.legend()
    wl = real["workload"]
    fig.suptitle(f"{real['config']['model']} on H200: {wl['num_requests']} ShareGPT requests, "
                 f"gamma {wl['rate']} req/s (CV {wl['cv']:.2f})\n{what}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")
