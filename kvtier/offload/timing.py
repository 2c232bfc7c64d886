"""Time the host tier's copies and the forward's waits for its loads, without a sync: CUDA
timing events, read once they have completed (`poll`, called at each step's issue). On
the CPU the copies are synchronous: their wall time is their time, and all of a load's
time is a stall of the step.

  * copy seconds per direction: start/end events on the copy stream around each issue, so
    bytes / seconds is the achieved rate of the io-backend;
  * stall seconds: the compute stream records an event, waits for a layer group's loads,
    records another; the pair's elapsed time is how long the forward stood still.
The simulator fills the same record at the cost model's prices (copy_times.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from kvtier.offload.copy_times import CopyTimes


class CopyTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.device = device
        self.times = CopyTimes()
        self._pending: list[tuple[Any, Any, str]] = []  # (start, end, field)

    def _event(self) -> Any:
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(self.device))
        return e

    def timed(self, field: str, work: Callable[[], None], stall: bool = False) -> None:
        """Run `work` (it issues copies on the current stream) and time it; `stall`: the
        step's forward waits for it (on the CPU, where copies are synchronous, all of it)."""
        if not self.cuda:
            t0 = time.perf_counter()
            work()
            dt = time.perf_counter() - t0
            setattr(self.times, field, getattr(self.times, field) + dt)
            if stall:
                self.times.stall_s += dt
            return
        start = self._event()
        work()
        self._pending.append((start, self._event(), field))

    def timed_wait(self, wait: Callable[[], None]) -> None:
        """The compute stream's wait for a load's event, timed (GPU only)."""
        if not self.cuda:
            wait()
            return
        start = self._event()
        wait()
        self._pending.append((start, self._event(), "stall_s"))

    def poll(self) -> None:
        """Add the intervals whose end has completed (no sync)."""
        left = []
        for start, end, field in self._pending:
            if end.query():
                setattr(self.times, field,
                        getattr(self.times, field) + start.elapsed_time(end) / 1e3)
            else:
                left.append((start, end, field))
        self._pending = left

    def flush(self) -> CopyTimes:
        """Every interval issued so far (waits for them): for a report at the end of a run."""
        for _, end, _ in self._pending:
            end.synchronize()
        self.poll()
        return self.times
