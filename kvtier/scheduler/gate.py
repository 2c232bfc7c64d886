"""What the scheduler asks of an admission gate: whether the waiting queue's head is
admitted now (the host tier's cache-aware admission, kvtier/offload/scheduling.py, is one)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvtier.core.request import Request


class AdmissionGate(Protocol):
    # A step's admissions start; the step may ask about one request twice (priority
    # scheduling walks the waiting queue before and after the swapped requests).
    def begin_step(self) -> None: ...

    # Given the running requests and the tokens the step computes so far.
    def admit_now(self, req: Request, running: list[Request], num_step_tokens: int) -> bool: ...

    # After the step's admissions: the requests left waiting (they wait at least this step).
    def fill_bubbles(self, waiting: Iterable[Request], step_tokens: int) -> None: ...
