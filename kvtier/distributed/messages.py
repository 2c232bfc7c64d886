"""What travels between the driver and a worker over its pipe (small and picklable):
the driver sends a StepPlan per step (ids and integers), then `Stop`; a worker sends
`WorkerReady` once, before the group's rendezvous, and `WorkerFailed` if it fails."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class WorkerReady:
    rank: int


@dataclass(frozen=True)
class WorkerFailed:
    rank: int
    traceback: str


@dataclass(frozen=True)
class Stop:
    """Close the runner, leave the group, exit."""


class TPWorkerError(RuntimeError):
    """A tensor-parallel worker failed or died; the engine cannot step any more."""
