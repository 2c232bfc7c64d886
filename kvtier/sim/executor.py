"""The simulated executor: the model runner's interface, no tensors, a virtual clock.

`execute(plan)` moves the clock forward by the cost model's prediction of the plan (the
runner's time plus the engine loop around it) and returns a token for every sampling row.
The token is a fixed ordinary id, so requests end where the workload says: at `max_tokens`
(the bench sets it to the dataset's output length, with ignore_eos), or, given
`output_lens`, with an end-of-sequence token at exactly that many output tokens.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from kvtier.core.executor import SyncExecutor
from kvtier.core.plan import StepPlan, StepResult
from kvtier.costmodel.model import CostModel
from kvtier.costmodel.shape import StepShape
from kvtier.costmodel.step_cost import StepCost
from kvtier.sim.clock import VirtualClock


@dataclass(frozen=True)
class SimStep:
    start_s: float
    shape: StepShape
    cost: StepCost


class StepObserver(Protocol):
    """Told of every priced step: what a component beside the engine accounts from the
    prices (the host tier's copy times, kvtier/offload/copy_times.py)."""

    def observe(self, shape: StepShape, cost: StepCost) -> None: ...


class SimulatedExecutor(SyncExecutor):
    def __init__(self, cost_model: CostModel, clock: VirtualClock, token_id: int,
                 eos_token_id: int | None = None, output_lens: Mapping[str, int] | None = None,
                 record: bool = False, captures_hidden: bool = False,
                 overlap_host: bool = False):
        """`token_id` must be no end-of-sequence or stop id; `output_lens` (request id ->
        output tokens) needs `eos_token_id`, and only ends requests that do not ignore eos.
        `overlap_host`: price each step as async scheduling runs it (`StepCost.overlapped_s`:
        its host time beside the previous step's device time); the engine's decisions stay
        those of synchronous steps."""
        if output_lens is not None and eos_token_id is None:
            raise ValueError("output_lens needs an eos_token_id to end requests with")
        self.cost_model, self.clock, self.token_id = cost_model, clock, token_id
        self.eos_token_id = eos_token_id
        self.output_lens = dict(output_lens) if output_lens is not None else None
        self.record = record
        self.captures_hidden = captures_hidden  # the runner stores hidden states (set by the memory system)
        self.steps: list[SimStep] = []
        self.busy_s = 0.0
        self.observers: list[StepObserver] = []
        self.overlap_host = overlap_host
        self.copies_busy_until = 0.0  # virtual time the background copies issued so far end

    def execute(self, plan: StepPlan) -> StepResult:
        shape = StepShape.from_plan(plan, self.captures_hidden)
        cost = self.cost_model.predict(shape)
        if self.record:
            self.steps.append(SimStep(self.clock.now(), shape, cost))
        # The previous steps' background copies still running: this step's GPU work waits
        # for them (the runner joins the copy stream first); its own start after that wait.
        wait = max(0.0, self.copies_busy_until - self.clock.now())
        if shape.items:
            self.copies_busy_until = (self.clock.now() + wait
                                      + self.cost_model.background_seconds(shape))
        seconds = wait + (cost.overlapped_s if self.overlap_host else cost.total_s)
        self.clock.advance(seconds)
        self.busy_s += seconds
        for observer in self.observers:
            observer.observe(shape, cost)
        sampled = {sr.request_id: self._token(sr.request_id, sr.num_output_tokens)
                   for sr in plan.scheduled if sr.sample}
        return StepResult(sampled=sampled)

    def _token(self, request_id: str, num_output_tokens: int) -> int:
        if self.output_lens is not None:
            target = self.output_lens.get(request_id)
            if target is not None and num_output_tokens + 1 >= target:
                return self.eos_token_id  # type: ignore[return-value]
        return self.token_id
