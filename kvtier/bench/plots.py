"""PNG figures of a benchmark, one line per policy (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from kvtier.bench.goodput import GoodputResult  # noqa: E402
from kvtier.bench.metrics import concurrency_timeline  # noqa: E402
from kvtier.bench.runner import RunResult  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _cdf(ax, values: list[float], label: str) -> None:
    if not values:
        return
    xs = np.sort(np.asarray(values) * 1000.0)
    ax.step(xs, np.arange(1, len(xs) + 1) / len(xs), where="post", label=label)


def plot_latency_cdfs(runs: Mapping[str, RunResult], path: Path) -> Path:
    """CDFs of TTFT, TPOT and E2E latency of the completed requests, in ms."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for policy, run in runs.items():
        done = [r for r in run.records if r.ok]
        _cdf(axes[0], [t for r in done if (t := r.ttft_s) is not None], policy)
        _cdf(axes[1], [t for r in done if (t := r.tpot_s) is not None], policy)
        _cdf(axes[2], [t for r in done if (t := r.e2e_s) is not None], policy)
    for ax, name in zip(axes, ("TTFT", "TPOT", "E2E latency")):
        lo, hi = ax.dataLim.x0, ax.dataLim.x1
        if lo > 0 and hi / lo > 100:  # queueing spreads latencies over decades
            ax.set_xscale("log")
        ax.set_xlabel(f"{name} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"{name} CDF")
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)


def plot_timeseries(runs: Mapping[str, RunResult], path: Path) -> Path:
    """KV blocks used on each tier, and requests running / in the system, over the run."""
    fig, axes = plt.subplots(3, 1, figsize=(11, 9), sharex=True)
    for policy, run in runs.items():
        t = [s.t_s for s in run.steps]
        line, = axes[0].plot(t, [s.stats.gpu_blocks_used for s in run.steps], label=policy)
        if run.steps:
            axes[0].axhline(run.steps[-1].stats.gpu_blocks_total, color=line.get_color(), ls=":", lw=1)
        axes[1].plot(t, [s.stats.host_blocks_used for s in run.steps], label=policy)
        axes[2].plot(t, [s.stats.num_running for s in run.steps], label=f"{policy}: running")
        times, counts = concurrency_timeline(run.records)
        axes[2].step(times, counts, where="post", ls="--", label=f"{policy}: in system")
    axes[0].set_ylabel("GPU KV blocks used\n(dotted: pool size)")
    axes[1].set_ylabel("host KV blocks used")
    axes[2].set_ylabel("requests")
    axes[2].set_xlabel("time since start (s)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path)


def plot_load_sweep(sweeps: Mapping[str, GoodputResult], path: Path) -> Path:
    """Throughput, TTFT p90 and SLO attainment against the offered request rate."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for policy, sweep in sweeps.items():
        probes = sorted(sweep.probes, key=lambda p: p.rate)
        rates = [p.rate for p in probes]
        extra = [p.extra or {} for p in probes]
        axes[0].plot(rates, [e.get("output_throughput", np.nan) for e in extra], "o-", label=policy)
        axes[1].plot(rates, [1000 * e.get("ttft_p90_s", np.nan) for e in extra], "o-", label=policy)
        axes[2].plot(rates, [p.attainment for p in probes], "o-", label=policy)
        if sweep.rate is not None:
            axes[2].axvline(sweep.rate, ls=":", lw=1, color=axes[2].lines[-1].get_color())
    targets = {s.target for s in sweeps.values()}
    for target in targets:
        axes[2].axhline(target, color="grey", ls="--", lw=1)
    titles = ("output tokens/s", "TTFT p90 (ms)", "SLO attainment (dotted: goodput)")
    for ax, title in zip(axes, titles):
        ax.set_xlabel("request rate (req/s)")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    return _save(fig, path)
