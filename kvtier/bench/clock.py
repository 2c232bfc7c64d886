"""The runner's notion of time: real time for engines, virtual time for fakes and simulators."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds on the clock the backend stamps tokens with."""
        ...

    def sleep(self, seconds: float) -> None: ...


class MonotonicClock:
    """`time.monotonic()`: the clock the engine stamps `RequestMetrics` with."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)
