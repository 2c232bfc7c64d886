"""A step's predicted time, as the cost model (kvtier/costmodel/model.py) prices it: the
executor's part, split by what it is spent on, and the engine loop around it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class StepCost:
    executor_s: float  # what ModelRunner.execute takes
    loop_s: float  # the engine loop around it
    graph: bool
    parts: dict[str, float] = field(default_factory=dict)
    piecewise: bool = False  # priced as a piecewise-graph step

    @property
    def total_s(self) -> float:
        return self.executor_s + self.loop_s

    @property
    def overlapped_s(self) -> float:
        """The step under async scheduling: the engine schedules, prepares and launches it
        (its `host` part and the loop) while the previous step's kernels run, so it takes
        the larger of that host time and its device time rather than their sum."""
        host = self.parts.get("host", 0.0)
        return max(self.executor_s - host, host + self.loop_s)
