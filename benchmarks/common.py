"""What every benchmark result JSON carries: command, commit, hardware, versions, date."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kvtier.bench.environment import git_info

T = TypeVar("T")

# Measured ceilings of the H200 reference machine (../shared/hw/h200_probe_2026-11-30.json).
H200_HBM_BYTES_PER_S = 4.24e12
H200_BF16_FLOPS = 761e12
H200_PCIE_BYTES_PER_S = 55e9

# Decode batch-size ranges for splitting an offline run's steps (and their floors) by batch:
# the linear layers are weight-read bound below the ridge (~180 tokens), compute bound above.
BATCH_BIN_EDGES = (1, 17, 65, 129, 257, 513, 1025)


def batch_bin(batch: int) -> str:
    """The label of the range holding `batch` ("1-16", ..., "513-1024", or "1025+")."""
    for lo, hi in zip(BATCH_BIN_EDGES, BATCH_BIN_EDGES[1:]):
        if lo <= batch < hi:
            return f"{lo}-{hi - 1}"
    return f"{BATCH_BIN_EDGES[-1]}+"


def command_line() -> str:
    """The command that repeats this run from the repository root: `python -m <module> ...`
    when it runs as a module (how the suite's scripts run), else the script's name."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    head = f"python -m {spec.name}" if spec is not None and spec.name else Path(sys.argv[0]).name
    return " ".join([head, *sys.argv[1:]])


def environment() -> dict[str, Any]:
    import torch

    env: dict[str, Any] = {
        "command": command_line(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu": platform.processor() or platform.machine(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    # The device machine gets a copy of the working tree whose .git (if any) may be stale:
    # the caller's KVTIER_GIT_COMMIT wins.
    env["git_commit"] = git_info()["commit"]
    # A switch that changes how the kernels launch (KVTIER_PDL=0: no programmatic launches).
    if "KVTIER_PDL" in os.environ:
        env["switches"] = {"KVTIER_PDL": os.environ["KVTIER_PDL"]}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
        env["gpu_memory_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
    return env


def monitored(fn: Callable[[], T]) -> tuple[T, dict[str, float] | None]:
    """fn()'s result and the GPU's mean SM clock and board power while it ran (NVML samples
    every 2 ms; None without NVML). Under the H200's power cap the clock explains time."""
    from kvtier.bench.gpu_monitor import GpuMonitor

    monitor = GpuMonitor.create(interval_s=0.002)
    if monitor is None:
        return fn(), None
    monitor.start()
    try:
        out = fn()
    finally:
        summary = monitor.stop()
    return out, {"sm_clock_mhz": summary.mean_sm_clock_mhz, "power_w": summary.mean_power_w,
                 "samples": len(summary.samples)}


def median_replay_s(graph: Any, iters: int) -> float:
    """Median device seconds of one replay of a captured CUDA graph (events, no host work)."""
    import statistics

    import torch

    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def write_result(path: str | Path, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment(), **payload}, indent=1))
    print(f"wrote {path}")


def time_once(fn: Callable[[], object], cuda: bool) -> float:
    """Seconds of one fn() call: CUDA events around it on the GPU (the caller synchronizes
    before, if it must), perf_counter on the CPU."""
    import torch

    if not cuda:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3
