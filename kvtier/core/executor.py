"""The executor seam: what runs a StepPlan. The model runner (tensors, kernels) and the
simulated executor (a cost model on a virtual clock) both implement `Executor`; LLMEngine
calls nothing else of either.

Contract:
  * `execute(plan)` runs the step and returns its sampled tokens (synchronous).
  * `launch(plan)` issues the step and returns a `PendingResult` at once; `result()` blocks
    until the tokens are on the host. The engine calls `result()` on launched steps in the
    order it launched them, and launches the next step before it reads the previous one's
    result only when `supports_async` is True (async scheduling). `execute(plan)` is
    `launch(plan).result()`: a wrapper that records or logs steps must wrap both.
  * `async_by_default`: whether the engine schedules asynchronously when its config leaves
    it open (a GPU: host work hides behind the device's).
  * `close()` releases the executor's memory now; nothing is called on it afterwards.
"""

from __future__ import annotations

from typing import Protocol

from kvtier.core.plan import StepPlan, StepResult


class PendingResult(Protocol):
    def result(self) -> StepResult: ...


class ReadyResult:
    """A step whose tokens are already on the host."""

    __slots__ = ("_result",)

    def __init__(self, result: StepResult):
        self._result = result

    def result(self) -> StepResult:
        return self._result


class Executor(Protocol):
    @property
    def async_by_default(self) -> bool: ...

    @property
    def supports_async(self) -> bool: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def launch(self, plan: StepPlan) -> PendingResult: ...

    def close(self) -> None: ...


class SyncExecutor:
    """Base of executors that finish a step before returning from it (the simulator, test
    executors): `launch` is `execute`, nothing to close, never asynchronous."""

    async_by_default = False
    supports_async = False

    def execute(self, plan: StepPlan) -> StepResult:
        raise NotImplementedError

    def launch(self, plan: StepPlan) -> PendingResult:
        return ReadyResult(self.execute(plan))

    def close(self) -> None:
        return None
