"""Arrival processes: when each request of a workload is sent, as offsets from the run's start.

Request 0 arrives at offset 0 and request i after i gaps, as vLLM's benchmark sends them.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

import numpy as np

# The Azure LLM inference trace (conversation, 2023; DynamoLLM's): mean and std of its first
# 3000 gaps, the seed paper's setting, which halves the gaps for ShareGPT (short prompts)
# and doubles them for L-Eval.
PAPER_AZURE_MEAN_GAP_S = 0.02215
PAPER_AZURE_STD_GAP_S = 0.03749
PAPER_AZURE_CV = PAPER_AZURE_STD_GAP_S / PAPER_AZURE_MEAN_GAP_S
PAPER_GAP_FACTOR = {"sharegpt": 0.5, "leval": 2.0}


class ArrivalKind(str, enum.Enum):
    OFFLINE = "offline"  # everything at t = 0 (throughput runs)
    POISSON = "poisson"
    GAMMA = "gamma"
    TRACE = "trace"  # the gaps of a recorded trace, optionally rate-scaled


@dataclass(frozen=True)
class ArrivalSpec:
    kind: ArrivalKind
    rate: float | None = None  # requests/s (poisson, gamma)
    cv: float = 1.0  # gamma: std/mean of the gaps; 1 is Poisson, > 1 burstier
    trace_gaps_s: tuple[float, ...] | None = None  # trace: recorded gaps in seconds
    scale: float = 1.0  # rate multiplier: 2.0 sends twice as fast (the same draws, gaps halved)

    def __post_init__(self) -> None:
        if self.kind in (ArrivalKind.POISSON, ArrivalKind.GAMMA) and not (self.rate and self.rate > 0):
            raise ValueError(f"{self.kind.value} arrivals need a rate > 0, got {self.rate}")
        if self.kind is ArrivalKind.GAMMA and self.cv <= 0:
            raise ValueError(f"gamma arrivals need cv > 0, got {self.cv}")
        if self.kind is ArrivalKind.TRACE and not self.trace_gaps_s:
            raise ValueError("trace arrivals need the trace's gaps")
        if self.scale <= 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")

    @property
    def mean_gap_s(self) -> float:
        """Mean gap of the process before scaling (poisson/gamma: 1/rate)."""
        if self.kind is ArrivalKind.TRACE and self.trace_gaps_s:
            return float(np.mean(self.trace_gaps_s))
        if self.rate:
            return 1.0 / self.rate
        raise ValueError(f"{self.kind.value} arrivals have no mean gap")

    @property
    def mean_rate(self) -> float | None:
        """Requests per second this process sends on average (None: all at once)."""
        if self.kind is ArrivalKind.OFFLINE:
            return None
        return self.scale / self.mean_gap_s

    def with_rate(self, rate: float) -> ArrivalSpec:
        """The same process sped up or slowed down to `rate` requests/s (for load sweeps)."""
        if self.kind is ArrivalKind.OFFLINE:
            raise ValueError("offline arrivals have no rate to sweep")
        if self.kind is ArrivalKind.TRACE:
            return replace(self, scale=rate * self.mean_gap_s)
        return replace(self, rate=rate, scale=1.0)


def paper_azure_gamma(workload: str, scale: float = 1.0) -> ArrivalSpec:
    """The paper-gamma arrivals for `workload`, `scale` times as fast."""
    mean_gap = PAPER_AZURE_MEAN_GAP_S * PAPER_GAP_FACTOR.get(workload, 1.0) / scale
    return ArrivalSpec(ArrivalKind.GAMMA, rate=1.0 / mean_gap, cv=PAPER_AZURE_CV)


def gamma_gaps(rng: np.random.Generator, num: int, mean_s: float, cv: float) -> np.ndarray:
    # Gamma(shape k, scale theta) has mean k*theta and CV 1/sqrt(k).
    shape = 1.0 / cv**2
    return rng.gamma(shape, mean_s / shape, size=num)


def arrival_gaps(spec: ArrivalSpec, num: int, seed: int) -> np.ndarray:
    """`num` gaps in seconds drawn from `spec`."""
    rng = np.random.default_rng(seed)
    if spec.kind is ArrivalKind.OFFLINE:
        return np.zeros(num)
    if spec.kind is ArrivalKind.POISSON:
        gaps = rng.exponential(spec.mean_gap_s, size=num)
    elif spec.kind is ArrivalKind.GAMMA:
        gaps = gamma_gaps(rng, num, spec.mean_gap_s, spec.cv)
    else:
        gaps = np.asarray(spec.trace_gaps_s or (), dtype=float)
        if len(gaps) < num:
            raise ValueError(f"the trace has {len(gaps)} gaps, {num} needed")
        gaps = gaps[:num]
    return gaps / spec.scale


def arrival_offsets(spec: ArrivalSpec, num_requests: int, seed: int) -> np.ndarray:
    """[num_requests] non-decreasing offsets in seconds, the first 0."""
    if num_requests < 1:
        return np.zeros(0)
    gaps = arrival_gaps(spec, num_requests - 1, seed)
    return np.concatenate([[0.0], np.cumsum(gaps)])
