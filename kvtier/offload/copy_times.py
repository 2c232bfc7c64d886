"""The host tier's copy-time record, and the simulator's way of filling it. Torch-free.

The runner's `CopyTimer` (timing.py) fills a `CopyTimes` from CUDA events; the simulated
executor has no events, so `PricedCopyTimer` fills the same record from each step's
host-tier items at the cost model's prices (items.py), and `HostTierMetrics` reads copy
seconds, GB/s and load stalls from either:

  * copy seconds: every store and load, backups and prefetches included, at the
    io-backend's curve (a backup or prefetch costs the step nothing but still crosses PCIe);
  * stall seconds: the loads the step's forward waits for (`HostLoad`): the cost model
    prices them as a serial part of the step, so all of their time is a wait.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.costmodel.model import StepCost
from kvtier.costmodel.shape import StepShape
from kvtier.kv.host_tier_items import (
    HostBackup,
    HostLoad,
    HostLoadDirect,
    HostPrefetch,
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
    """How a kind's copies are timed. `direct` None: by the tier's io-backend (backups and
    prefetches have no kind of their own per backend)."""

    to_device: bool
    direct: bool | None
    stall: bool  # the step's forward waits for it


_KINDS = {
    HostStore.kind: _Priced(False, False, False),
    HostStoreDirect.kind: _Priced(False, True, False),
    HostBackup.kind: _Priced(False, None, False),
    HostLoad.kind: _Priced(True, False, True),
    HostLoadDirect.kind: _Priced(True, True, True),
    HostPrefetch.kind: _Priced(True, None, False),
}


class PricedCopyTimer:
    """Observes the simulated executor's steps (`SimulatedExecutor.observers`). `direct`:
    the tier's io-backend is the copy engine (prices its backups and prefetches)."""

    def __init__(self, cost_model: Any, direct: bool):
        self.cost_model, self.direct = cost_model, direct
        self.times = CopyTimes()

    def observe(self, shape: StepShape, cost: StepCost) -> None:
        t = self.times
        for kind, count in shape.items:
            p = _KINDS.get(kind)
            if p is None or not count:
                continue
            direct = self.direct if p.direct is None else p.direct
            s = copy_seconds(self.cost_model, count, p.to_device, direct)
            if p.to_device:
                t.load_s += s
            else:
                t.store_s += s
            if p.stall:
                t.stall_s += s
