"""Goodput (DistServe): the highest request rate at which >= 90 % of requests meet both SLOs.

Attainment is of the requests sent: a run cut by --max-duration leaves the later arrivals
unsent, and those are not misses (the probes keep the strict figure, `attainment_all`).

Found by running the workload at several rates: a bisection assuming SLO attainment falls
as the rate grows (true of a queueing system up to run-to-run noise), or a fixed grid.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.bench.metrics import ATTAINMENT_BASIS


@dataclass(frozen=True)
class Probe:
    rate: float
    attainment: float
    extra: dict | None = None  # what the run function reported besides attainment


@dataclass(frozen=True)
class GoodputResult:
    rate: float | None  # None: even the lowest rate tried misses the target
    target: float
    probes: tuple[Probe, ...]  # in the order run
    at_upper_bound: bool  # the highest rate tried met the target: goodput may be higher

    def to_dict(self) -> dict:
        return {
            "goodput_rate": self.rate,
            "target_attainment": self.target,
            "attainment_basis": ATTAINMENT_BASIS,
            "at_upper_bound": self.at_upper_bound,
            "probes": [
                {"rate": p.rate, "attainment": p.attainment, **(p.extra or {})}
                for p in sorted(self.probes, key=lambda p: p.rate)
            ],
        }


RunAtRate = Callable[[float], tuple[float, dict | None]]  # rate -> (attainment, extra figures)


def goodput_bisect(
    run_at_rate: RunAtRate,
    low: float,
    high: float,
    target: float = 0.9,
    rel_tol: float = 0.05,
    max_probes: int = 12,
) -> GoodputResult:
    """Bisect (geometrically: rates span decades) until high/low <= 1 + rel_tol."""
    if not 0 < low < high:
        raise ValueError(f"need 0 < low < high, got {low}, {high}")
    probes: list[Probe] = []

    def ok(rate: float) -> bool:
        attainment, extra = run_at_rate(rate)
        probes.append(Probe(rate, attainment, extra))
        return attainment >= target

    if ok(high):
        return GoodputResult(high, target, tuple(probes), at_upper_bound=True)
    if not ok(low):
        return GoodputResult(None, target, tuple(probes), at_upper_bound=False)
    while high / low > 1 + rel_tol and len(probes) < max_probes:
        mid = math.sqrt(low * high)
        if ok(mid):
            low = mid
        else:
            high = mid
    return GoodputResult(low, target, tuple(probes), at_upper_bound=False)


def goodput_grid(run_at_rate: RunAtRate, rates: Sequence[float], target: float = 0.9) -> GoodputResult:
    """Run every rate (a load sweep for plots too); goodput is the highest passing rate
    below the first failing one, so a lucky pass past a failure does not count."""
    if not rates:
        raise ValueError("need at least one rate")
    probes = [Probe(r, *run_at_rate(r)) for r in sorted(rates)]
    best = None
    for p in probes:
        if p.attainment < target:
            break
        best = p.rate
    return GoodputResult(best, target, tuple(probes), at_upper_bound=best == probes[-1].rate)
