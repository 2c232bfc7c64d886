"""GPU utilisation, memory and power sampled through NVML in a background thread.

NVML's "GPU utilisation" is the fraction of time at least one kernel was running, not SM
occupancy (that needs DCGM profiling counters); it is reported under that name. Energy is
the difference of the board's energy counter (Volta and later), else the integral of the
power samples.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GpuSample:
    t_s: float
    gpu_util_pct: float
    mem_used_bytes: int
    power_w: float
    sm_clock_mhz: float = 0.0  # 0 where the board does not report it


@dataclass(frozen=True)
class GpuSummary:
    device_name: str
    samples: tuple[GpuSample, ...]
    energy_j: float
    duration_s: float

    @property
    def mean_gpu_util_pct(self) -> float:
        return _mean([s.gpu_util_pct for s in self.samples])

    @property
    def mean_power_w(self) -> float:
        return _mean([s.power_w for s in self.samples])

    @property
    def mean_sm_clock_mhz(self) -> float:
        return _mean([s.sm_clock_mhz for s in self.samples])

    @property
    def max_mem_used_bytes(self) -> int:
        return max((s.mem_used_bytes for s in self.samples), default=0)

    def to_dict(self, output_tokens: int) -> dict:
        return {
            "device_name": self.device_name,
            "mean_gpu_util_pct": self.mean_gpu_util_pct,
            "mean_power_w": self.mean_power_w,
            "mean_sm_clock_mhz": self.mean_sm_clock_mhz,
            "max_mem_used_bytes": self.max_mem_used_bytes,
            "energy_j": self.energy_j,
            "energy_per_output_token_j": self.energy_j / output_tokens if output_tokens else None,
            "num_samples": len(self.samples),
        }


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _default_index() -> int:
    # NVML ignores CUDA_VISIBLE_DEVICES; map the engine's device 0 to the physical index.
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return int(first) if first.isdigit() else 0


class GpuMonitor:
    """`start()` … `stop() -> GpuSummary`. Use `GpuMonitor.create()` to get None without a GPU."""

    def __init__(self, nvml: Any, index: int, interval_s: float = 0.1):
        self._nvml, self._interval = nvml, interval_s
        self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
        name = nvml.nvmlDeviceGetName(self._handle)
        self._name = name.decode() if isinstance(name, bytes) else str(name)
        self._samples: list[GpuSample] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._energy0: int | None = None

    @classmethod
    def create(cls, interval_s: float = 0.1, index: int | None = None) -> GpuMonitor | None:
        """A monitor of the engine's GPU, or None where NVML or a GPU is missing."""
        try:
            import pynvml

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() == 0:
                return None
            return cls(pynvml, _default_index() if index is None else index, interval_s)
        except Exception:  # no library, no driver, no device: run without GPU figures
            return None

    def start(self) -> None:
        self._samples.clear()
        self._stop.clear()
        self._t0 = time.monotonic()
        self._energy0 = self._energy_mj()
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> GpuSummary:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        duration = time.monotonic() - self._t0
        energy_end = self._energy_mj()
        if self._energy0 is not None and energy_end is not None:
            energy_j = (energy_end - self._energy0) / 1000.0
        else:
            energy_j = _integrate_power(self._samples)
        return GpuSummary(self._name, tuple(self._samples), energy_j, duration)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._samples.append(self._sample())
            self._stop.wait(self._interval)

    def _sample(self) -> GpuSample:
        nvml, h = self._nvml, self._handle
        util = nvml.nvmlDeviceGetUtilizationRates(h)
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        power_mw = nvml.nvmlDeviceGetPowerUsage(h)
        return GpuSample(time.monotonic() - self._t0, float(util.gpu), int(mem.used),
                         power_mw / 1000.0, self._sm_clock_mhz())

    def _sm_clock_mhz(self) -> float:
        # The SM clock shows power or thermal throttling: a GEMM-bound step slows with it.
        try:
            return float(self._nvml.nvmlDeviceGetClockInfo(self._handle, self._nvml.NVML_CLOCK_SM))
        except Exception:  # an NVML without clock queries
            return 0.0

    def _energy_mj(self) -> int | None:
        try:
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except Exception:  # pre-Volta boards have no energy counter
            return None


def _integrate_power(samples: list[GpuSample] | tuple[GpuSample, ...]) -> float:
    """Trapezoidal integral of power over the sample times, in joules."""
    return sum((a.power_w + b.power_w) / 2 * (b.t_s - a.t_s) for a, b in zip(samples, samples[1:]))
