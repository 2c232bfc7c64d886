"""One step's tokens as the scheduler hands them out, for the host-resident systems' forecasts
of a step before it is scheduled (torch-free). The order and limits are the scheduler's
(kvtier/scheduler/scheduler.py): running requests first, oldest first, while the token
budget lasts; a prefill's chunk capped and counted by the step's PrefillChunker (a prefill
the step has no partial place for sits it out); then waiting prompts, each admitted with its
first chunk, until one does not fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from kvtier.core.request import Request
from kvtier.scheduler.prefill_budget import PrefillChunker


@dataclass(frozen=True)
class StepLimits:
    """The scheduler's limits on a step's tokens (its SchedulerConfig's)."""

    tokens: int = 8192  # max_num_batched_tokens
    long_prefill_threshold: int = 0  # the effective one (0: no cap)
    max_partial_prefills: int = 1
    chunked_prefill: bool = True

    def start(self) -> StepTokens:
        """A fresh forecast of one step's tokens."""
        return StepTokens(self.tokens,
                          PrefillChunker(self.long_prefill_threshold, self.max_partial_prefills),
                          self.chunked_prefill)

    def chunk_cap(self) -> int:
        """The most tokens one prefill chunk takes."""
        return min(self.tokens, self.long_prefill_threshold or self.tokens)


class StepTokens:
    def __init__(self, budget: int, chunker: PrefillChunker | None = None,
                 chunked_prefill: bool = True):
        """`chunker`: the scheduler's long-prefill controls (None: no cap, one partial
        prefill a step, the scheduler's rule without them)."""
        self.budget = budget
        self.chunker = chunker if chunker is not None else PrefillChunker(0, 1)
        self.chunked_prefill = chunked_prefill

    def running(self, running: Iterable[Request]) -> Iterator[tuple[Request, int, int]]:
        """(request, tokens it computes this step, its uncomputed tokens) of the running
        requests the step schedules, in order: a decode computes 1."""
        for req in running:
            if self.budget <= 0:
                return
            pending = req.num_pending_tokens  # async scheduling only
            if pending and len(req.output_token_ids) + pending >= req.max_tokens:
                continue  # its last token is in flight: not scheduled again
            remaining = req.num_tokens + pending - req.num_computed_tokens
            n = min(remaining, self.budget)
            if remaining > 1:
                n = self.chunker.chunk(remaining, n)
                if not n:
                    continue
            self.budget -= n
            yield req, n, remaining

    def take_running(self, running: Iterable[Request]) -> None:
        """The running requests' tokens and partial places, taken as `running` takes them."""
        for _ in self.running(running):
            pass

    def admit(self, req: Request) -> int:
        """The first chunk of waiting `req` if the step admits it (its tokens are taken from
        the budget), else 0: the step admits no more (FCFS)."""
        remaining = req.num_tokens - req.num_computed_tokens
        if self.budget <= 0 or remaining <= 0 or (
                not self.chunked_prefill and remaining > self.budget):
            return 0
        n = self.chunker.chunk(remaining, min(remaining, self.budget))
        self.budget -= n
        return n
