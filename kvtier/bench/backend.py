"""The seam between the runner and what serves the requests.

A backend accepts requests and reports them back when they finish, with the time of each
token. The in-process engine is one (`engine_backend.py`); an OpenAI-HTTP client that
streams from `kvtier serve` is another: `submit` starts a streaming request on a worker,
`poll` waits on the queue the workers fill, `stats` scrapes the server's metrics or
returns None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Protocol

from kvtier.bench.request import BenchRequest
from kvtier.engine.outputs import EngineStats


@dataclass(frozen=True)
class RequestRecord:
    """What happened to one request. Times are on the backend's clock until `rebased`."""

    request_id: str
    prompt_len: int
    expected_output_len: int
    arrival_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]  # one per output token
    finish_s: float | None
    finish_reason: str | None  # "length" | "stop" | "abort" | None (never finished)
    num_preemptions: int = 0
    error: str | None = None
    sent: bool = True  # False: still due when the run's time limit came (never submitted)
    num_cached_tokens: int | None = None  # prompt tokens the prefix cache supplied; None: unknown
    first_scheduled_s: float | None = None  # the engine first scheduled it; None: unknown

    @property
    def output_len(self) -> int:
        return len(self.token_times_s)

    @property
    def ok(self) -> bool:
        """Finished normally; failed and aborted requests count against SLOs."""
        return self.error is None and self.finish_reason in ("length", "stop")

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def queue_s(self) -> float | None:
        """Arrival to first scheduled: the part of the TTFT spent waiting."""
        s = self.first_scheduled_s
        return None if s is None else s - self.arrival_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1), vLLM's definition; None below 2 tokens."""
        ttft, e2e = self.ttft_s, self.e2e_s
        if not self.ok or self.output_len < 2 or ttft is None or e2e is None:
            return None
        return (e2e - ttft) / (self.output_len - 1)

    def itls_s(self) -> list[float]:
        t = self.token_times_s
        return [b - a for a, b in zip(t, t[1:])]

    def rebased(self, t0: float) -> RequestRecord:
        """Times as seconds since `t0`."""

        def shift(t: float | None) -> float | None:
            return None if t is None else t - t0

        return replace(
            self,
            arrival_s=self.arrival_s - t0,
            first_token_s=shift(self.first_token_s),
            first_scheduled_s=shift(self.first_scheduled_s),
            token_times_s=tuple(t - t0 for t in self.token_times_s),
            finish_s=shift(self.finish_s),
        )


class Backend(Protocol):
    """Serves a workload's requests for the runner. Single-threaded use by the runner.

    Token times are on `time.monotonic()` unless the backend has a `clock` attribute (a
    `kvtier.bench.clock.Clock`, e.g. a simulator's virtual time): the runner then schedules
    arrivals and sleeps on that clock.
    """

    def submit(self, request_id: str, request: BenchRequest, arrival_time: float) -> None:
        """Hand one request over. `arrival_time` is when it was due on the runner's clock
        (it may be a little in the past): latencies count from it, not from the call."""
        ...

    def poll(self, timeout_s: float) -> list[RequestRecord]:
        """Make progress, waiting at most about `timeout_s` when there is nothing to do, and
        return the requests that ended since the last call (each exactly once)."""
        ...

    def num_unfinished(self) -> int:
        """Submitted requests not yet returned by `poll`."""
        ...

    def abort(self, request_ids: Iterable[str]) -> None:
        """Stop these requests; the next `poll` returns them with finish_reason "abort"."""
        ...

    def stats(self) -> EngineStats | None:
        """The engine's state now, or None where the backend cannot see it."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Drop the engine's cached KV blocks, with no request running (after the warm-up,
        whose prompts are the workload's first: left cached, they would hit); False where
        the backend cannot."""
        ...

    def close(self) -> None:
        """Release what serves the requests (an engine's memory, connections)."""
        ...
