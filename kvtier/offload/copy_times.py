"""The host tier's copy-time record, and the simulator's way of filling it. Torch-free.

The runner's `CopyTimer` (timing.py) fills a `CopyTimes` from CUDA events; the simulated
executor has no events, so `PricedCopyTimer` fills the same record from each step's
host-tier items at the cost model's prices (items.py), and `HostTierMetrics` reads copy
seconds, GB/s and load stalls from either:

  * copy seconds: every store and load, backups and prefetches included, at the
    io-backend's curve (a backup or prefetch costs the step only what it slows the forward
    beside it, and the next step what of its copy is left, but its whole copy crosses PCIe);
  * stall seconds: the loads the step's forward waits for (`HostLoad`): the cost model
    prices them as a serial part of the step, so all of their time is a wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.costmodel.shape import StepShape
from kvtier.costmodel.step_cost import StepCost
from kvtier.kv.host_tier_items import (
    HostBackup,
    HostBackupDirect,
    HostLoad,
    HostLoadDirect,
    HostPrefetch,
    HostPrefetchDirect,
    HostStore,
    HostStoreDirect,
)
from kvtier.offload.items import copy_seconds


@dataclass
class CopyTimes:
    store_s: float = 0.0
    load_s: float = 0.0
    stall_s: float = 0.0


@dataclass(frozen=True)
class _Priced:
    """How a kind's copies are timed: which way, by which io-backend's curve, and whether
    the step's forward waits for them."""

    to_device: bool
    direct: bool
    stall: bool


_KINDS = {
    HostStore.kind: _Priced(False, False, False),
    HostStoreDirect.kind: _Priced(False, True, False),
    HostBackup.kind: _Priced(False, False, False),
    HostBackupDirect.kind: _Priced(False, True, False),
    HostLoad.kind: _Priced(True, False, True),
    HostLoadDirect.kind: _Priced(True, True, True),
    HostPrefetch.kind: _Priced(True, False, False),
    HostPrefetchDirect.kind: _Priced(True, True, False),
}


class PricedCopyTimer:
    """Observes the simulated executor's steps (`SimulatedExecutor.observers`)."""

    def __init__(self, cost_model: Any):
        self.cost_model = cost_model
        self.times = CopyTimes()

    def observe(self, shape: StepShape, cost: StepCost) -> None:
        t = self.times
        for kind, count in shape.items:
            p = _KINDS.get(kind)
            if p is None or not count:
                continue
            s = copy_seconds(self.cost_model, count, p.to_device, p.direct)
            if p.to_device:
                t.load_s += s
            else:
                t.store_s += s
            if p.stall:
                t.stall_s += s
