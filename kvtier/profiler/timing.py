"""Timing on the device: operator calls inside CUDA graphs (device time, no launch cost),
whole steps by wall clock around a synchronising call. On the CPU (tests) both fall back
to wall time of plain calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class DeviceTimer:
    def __init__(self, device: torch.device, reps: int = 5):
        self.device, self.reps = device, reps
        self.cuda = device.type == "cuda"
        self.fallbacks: list[str] = []  # captures that failed (reported in the calibration)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def graph_seconds(self, fn: Callable[[], object]) -> float:
        """Median device seconds of one `fn()` captured in a CUDA graph and replayed."""
        fn()  # warm-up: Triton compiles, cuBLAS picks its kernel, outside the capture
        self.sync()
        if not self.cuda:
            return self.wall_seconds(fn)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
        except RuntimeError as e:  # not capturable: time it eagerly (launch costs included)
            self.fallbacks.append(str(e).splitlines()[0][:200])
            return self.wall_seconds(fn)
        graph.replay()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(self.reps):
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        del graph
        return statistics.median(times)

    def wall_seconds(self, fn: Callable[[], object], warmup: int = 1) -> float:
        """Median wall seconds of `fn()` followed by a device sync."""
        for _ in range(warmup):
            fn()
        self.sync()
        times = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            self.sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)
