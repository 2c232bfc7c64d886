"""NEO's balance of the two sides of a step: a decode moves to the host only while the CPU
attention of every host-running decode stays hidden under the step's GPU work,

    T_cdec(host decodes, the mover included) <= factor * T_gpu(step)

(kvtier/policies/host_resident/balance.py's `hidden_under_gpu`, with T_host the CPU
attention's price `price_cpu_rows`). T_gpu: the step's forward on the GPU from kvtier's cost
model: the linear layers of the whole batch (host decodes too), the attention of the
device-resident decodes and the running prefills' chunks. A move the rule refuses is not
made: the device pool stays short and the scheduler preempts as usual (recompute), as NEO's
scheduler keeps such requests waiting instead of letting the CPU set the step time. factor 0
lifts the limit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.core.request import Request
from kvtier.policies.host_resident.balance import HostBalance, StepSums, hidden_under_gpu


@dataclass(frozen=True)
class CpuBalance(HostBalance):
    pays: Callable[[HostBalance, StepSums, Request, int, int], bool] = field(
        default=hidden_under_gpu, kw_only=True)
