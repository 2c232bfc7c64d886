"""Virtual time: the engine stamps arrivals and tokens with it, the simulated executor moves
it forward by each step's predicted time, and the bench runner "sleeps" on it (a jump)."""

from __future__ import annotations


class VirtualClock:
    """Callable as the engine's `clock`; `now`/`sleep` make it a `kvtier.bench.clock.Clock`."""

    def __init__(self, start: float = 0.0):
        self._now = float(start)

    def __call__(self) -> float:
        return self._now

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self._now += seconds

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time cannot go back ({seconds} s)")
        self._now += seconds

    def advance_to(self, t: float) -> None:
        self._now = max(self._now, t)
