"""NEO's per-step choice between its two ways of running a step with CPU decodes
(torch-free: the scheduler side decides, the simulator runs it too):

  * pipelined: two sub-batches, batch 1 = the CPU decodes (the step's leading rows), batch 0
    = the rest (prefills and GPU decodes); per layer the CPU attends for batch 1 while the
    GPU runs batch 0's whole layer, then batch 1's linear layers (neo/pipelined.py);
  * sequential: one batch, the CPU attention of each layer waited for in place.

NEO's rule: pipeline when the GPU work the CPU attention can hide under covers it,

    T_linear(b1) + T_pref + T_gdec >= T_cdec + T_launch

T_linear(b1): batch 1's forward apart from attention, T_pref + T_gdec: batch 0's forward,
from kvtier's cost model (calibrated when given one); T_cdec: the CPU attention's price
(`price_cpu_rows`); T_launch: NEO's predictor's launch constant, the extra launches of
splitting the batch.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.core.plan import ScheduledRequest
from kvtier.costmodel.shape import StepShape

LAUNCH_S = 0.8e-3  # NEO's lnch_T (NEO-MLSys25/NEO's predictor)


class PipelineMode(str, enum.Enum):
    AUTO = "auto"  # NEO's rule, per step
    ON = "on"  # every step with CPU decodes
    OFF = "off"  # never


@dataclass(frozen=True)
class PipelineRule:
    cost_model: Any  # kvtier.costmodel.CostModel
    price_cpu_rows: Any  # (cost_model, context tokens) -> seconds
    launch_s: float = LAUNCH_S

    def pipelined(self, scheduled: Sequence[ScheduledRequest], num_rows: int,
                  num_host_tokens: int) -> bool:
        cm = self.cost_model
        b1 = StepShape(num_decodes=num_rows, decode_ctx_sum=num_rows, decode_ctx_max=1)
        gpu_linear_b1 = forward_s(cm, b1)
        rest = scheduled[num_rows:]
        b0 = _shape(rest)
        gpu_b0 = forward_s(cm, b0) if rest else 0.0
        cpu = self.price_cpu_rows(cm, num_host_tokens)
        return gpu_linear_b1 + gpu_b0 >= cpu + self.launch_s


def _shape(scheduled: Sequence[ScheduledRequest]) -> StepShape:
    decodes = [sr.start_pos + 1 for sr in scheduled if len(sr.token_ids) == 1]
    prefills = tuple((len(sr.token_ids), sr.start_pos) for sr in scheduled
                     if len(sr.token_ids) != 1)
    return StepShape(num_decodes=len(decodes), decode_ctx_sum=sum(decodes),
                     decode_ctx_max=max(decodes, default=0), prefills=prefills)


def forward_s(cost_model: Any, shape: StepShape) -> float:
    """The forward's seconds of a step of this shape (its GPU work, without sampling)."""
    cost = cost_model.predict(shape)
    return cost.parts.get("forward", cost.executor_s)
