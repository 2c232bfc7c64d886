"""NEO's rule for pipelining a step with CPU decodes (torch-free: the scheduler side decides,
the simulator runs it too): pipeline only when the GPU work the CPU attention can hide
under covers it,

    T_linear(b1) + T_pref + T_gdec >= T_cdec + layers x T_launch

T_linear(b1): batch 1's (the CPU decodes') forward apart from attention, T_pref + T_gdec:
batch 0's forward, from kvtier's cost model (calibrated when given one); T_cdec: the CPU
attention's price (`price_cpu_rows`); T_launch: NEO's predictor's launch constant a layer
(neo/steps.py's LAUNCH_S), what splitting each layer costs. The rule gates pipelining;
among the ways it allows, the step runs the one of the best predicted rate (neo/modes.py,
priced by neo/steps.py).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvtier.core.plan import ScheduledRequest
from kvtier.costmodel.shape import StepShape
from kvtier.policies.neo.steps import LAUNCH_S, batch0, forward_s, linear_only


class PipelineMode(str, enum.Enum):
    AUTO = "auto"  # NEO's rule and predicted rates, per step (GPU-only steps too)
    ON = "on"  # every step with CPU decodes
    OFF = "off"  # never


@dataclass(frozen=True)
class PipelineRule:
    cost_model: Any  # kvtier.costmodel.CostModel
    price_cpu_rows: Any  # (cost_model, context tokens) -> seconds
    launch_s: float = LAUNCH_S

    def pipelined(self, scheduled: Sequence[ScheduledRequest], num_rows: int,
                  num_host_tokens: int) -> bool:
        """The rule over a step's scheduled rows (the first `num_rows` on the CPU)."""
        return self.holds(step_shape(scheduled), num_rows, num_host_tokens)

    def holds(self, shape: StepShape, num_rows: int, num_host_tokens: int) -> bool:
        """The rule over a step's shape whose leading `num_rows` decodes are on the CPU."""
        return self.holds_beside(self.batch0_s(shape, num_rows, num_host_tokens), num_rows,
                                 num_host_tokens)

    def batch0_s(self, shape: StepShape, num_rows: int, num_host_tokens: int) -> float:
        """T_pref + T_gdec: the GPU forward of the step without its CPU decodes (the same
        however many of them a step leaves out)."""
        b0 = replace(batch0(shape, num_rows, num_host_tokens), num_sampled=0, items=())
        return forward_s(self.cost_model, b0) if b0.num_reqs else 0.0

    def holds_beside(self, batch0_s: float, num_rows: int, num_host_tokens: int) -> bool:
        """The rule for `num_rows` CPU decodes of `num_host_tokens` beside batch 0's GPU
        forward of `batch0_s` seconds."""
        cm = self.cost_model
        cpu = self.price_cpu_rows(cm, num_host_tokens)
        launch = self.launch_s * cm.mc.num_layers
        return forward_s(cm, linear_only(num_rows)) + batch0_s >= cpu + launch


def step_shape(scheduled: Sequence[ScheduledRequest]) -> StepShape:
    """The shape of a step's rows (no copies, no items)."""
    decodes = [sr.start_pos + 1 for sr in scheduled if len(sr.token_ids) == 1]
    prefills = tuple((len(sr.token_ids), sr.start_pos) for sr in scheduled
                     if len(sr.token_ids) != 1)
    return StepShape(num_decodes=len(decodes), decode_ctx_sum=sum(decodes),
                     decode_ctx_max=max(decodes, default=0), prefills=prefills,
                     num_sampled=sum(sr.sample for sr in scheduled))
