"""NEO's balance of the two sides of a step (torch-free: the scheduler side decides, the
simulator runs it too). A decode moves to the host only while the CPU attention of every
host-running decode stays hidden under the step's GPU work:

    T_cdec(host decodes, the mover included) <= factor * T_gpu(step)

T_gpu: the step's forward on the GPU from kvtier's cost model: the linear layers of the whole
batch (host decodes too), the attention of the device-resident decodes and the running
prefills' chunks. T_cdec: the CPU attention's price (`price_cpu_rows`). A move the rule
refuses is not made: the device pool stays short and the scheduler preempts as usual
(recompute), as NEO's scheduler keeps such requests waiting instead of letting the CPU set
the step time. factor 0 lifts the limit.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.core.request import Request
from kvtier.costmodel.shape import StepShape
from kvtier.policies.neo.steps import forward_s


@dataclass(frozen=True)
class CpuBalance:
    cost_model: Any  # kvtier.costmodel.CostModel
    price_cpu_rows: Any  # (cost_model, context tokens) -> seconds
    factor: float = 1.0
    max_step_tokens: int = 8192  # the scheduler's token budget caps a prefill's chunk

    def mover(self, running: Sequence[Request], host: Collection[str]) -> Callable[[Request], bool]:
        """A check for this step's candidates, taken in order: True (and counted on the
        host side from then on) when the candidate may move."""
        return _StepBalance(self, running, host)


class _StepBalance:
    """One step's sums, updated as candidates move."""

    def __init__(self, rule: CpuBalance, running: Sequence[Request], host: Collection[str]):
        self.rule = rule
        self.host_rows = self.host_tokens = self.gpu_rows = self.gpu_ctx_sum = 0
        self.gpu_ctx_max = 0
        prefills = []
        budget = rule.max_step_tokens
        for req in running:
            remaining = req.num_tokens + req.num_pending_tokens - req.num_computed_tokens
            if remaining > 1:  # a prefill: its chunk this step, within the token budget
                n = min(remaining, budget)
                if n > 0:
                    prefills.append((n, req.num_computed_tokens))
                    budget -= n
                continue
            ctx = req.num_computed_tokens + 1
            if req.request_id in host:
                self.host_rows, self.host_tokens = self.host_rows + 1, self.host_tokens + ctx
            else:
                self.gpu_rows, self.gpu_ctx_sum = self.gpu_rows + 1, self.gpu_ctx_sum + ctx
                self.gpu_ctx_max = max(self.gpu_ctx_max, ctx)
        self.prefills = tuple(prefills)

    def __call__(self, req: Request) -> bool:
        ctx = req.num_computed_tokens + 1
        rule = self.rule
        if rule.factor > 0:
            cpu = rule.price_cpu_rows(rule.cost_model, self.host_tokens + ctx)
            if cpu > rule.factor * self.gpu_s(moved_ctx=ctx):
                return False
        self.host_rows, self.host_tokens = self.host_rows + 1, self.host_tokens + ctx
        self.gpu_rows, self.gpu_ctx_sum = self.gpu_rows - 1, self.gpu_ctx_sum - ctx
        return True

    def gpu_s(self, moved_ctx: int) -> float:
        """The step's GPU forward once a decode of context `moved_ctx` has moved: a host
        row still runs the linear layers on the GPU (priced as a decode of context 1)."""
        rows = self.host_rows + 1
        shape = StepShape(num_decodes=self.gpu_rows - 1 + rows,
                          decode_ctx_sum=max(0, self.gpu_ctx_sum - moved_ctx) + rows,
                          decode_ctx_max=self.gpu_ctx_max, prefills=self.prefills)
        return forward_s(self.rule.cost_model, shape)
