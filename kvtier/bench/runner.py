"""Plays a workload against a backend in real time and records what happened.

Open loop: each request is submitted at its arrival offset whatever the backend is doing
(its arrival time is the due time, so a late submission still counts as queueing), and the
engine's state is sampled after every step. Closed loop for follow-ups (a conversation's
next turn): due a think time after the request they follow ended, however it ended.

`max_concurrency` (vLLM's and SGLang's `--max-concurrency`): at most that many requests in
flight; a request due while they are is held on the client until one ends, and is timed
from its send, as those benchmarks time it.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

from tqdm import tqdm

from kvtier.bench.backend import Backend, RequestRecord
from kvtier.bench.clock import Clock, MonotonicClock
from kvtier.bench.gpu_monitor import GpuMonitor, GpuSummary
from kvtier.bench.request import BenchRequest
from kvtier.config import ConfigError
from kvtier.engine.outputs import EngineStats


@dataclass(frozen=True)
class StepSample:
    t_s: float  # seconds since the run's start, taken after the step
    stats: EngineStats


@dataclass(frozen=True)
class RunResult:
    records: tuple[RequestRecord, ...]  # in workload order; times in seconds since the start
    steps: tuple[StepSample, ...] = field(repr=False)
    duration_s: float  # start to the last request's end
    baseline: EngineStats | None  # the counters before the first request (warm-up excluded)
    gpu: GpuSummary | None = None
    max_submit_lag_s: float = 0.0  # how late the runner handed a request over, worst case

    def counter_delta(self, name: str) -> int | None:
        """How much a cumulative `EngineStats` counter grew during this run."""
        if not self.steps or self.baseline is None:
            return None
        return getattr(self.steps[-1].stats, name) - getattr(self.baseline, name)


@dataclass(frozen=True)
class RunOptions:
    progress: bool = True
    max_duration_s: float | None = None  # abort what is left after this long (overload sweeps)
    id_prefix: str = "bench"
    max_concurrency: int | None = None  # requests in flight at most (None: no cap)

    def __post_init__(self) -> None:
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ConfigError(f"--max-concurrency must be >= 1, got {self.max_concurrency}")


class _Sends:
    """Which requests are due when, as offsets from the run's start: the open-loop ones at
    their arrival, a follow-up `think_s` after the request it follows ended."""

    def __init__(self, requests: tuple[BenchRequest, ...] | list[BenchRequest]):
        self.requests = requests
        self.followers: dict[int, list[int]] = {}
        self.due: list[tuple[float, int]] = []  # a heap of (offset, index)
        for i, r in enumerate(requests):
            if r.follows is None:
                self.due.append((r.arrival_s, i))
            elif not 0 <= r.follows < i:
                raise ValueError(f"request {i} follows {r.follows}: a follow-up must follow "
                                 "an earlier request of the workload")
            else:
                self.followers.setdefault(r.follows, []).append(i)
        heapq.heapify(self.due)
        self.num_unsent = len(requests)

    def __bool__(self) -> bool:
        return self.num_unsent > 0

    def next_due(self) -> float | None:
        return self.due[0][0] if self.due else None

    def pop(self) -> int:
        self.num_unsent -= 1
        return heapq.heappop(self.due)[1]

    def ended(self, index: int, end_s: float) -> None:
        """Request `index` ended at offset `end_s`: its follow-ups fall due."""
        for j in self.followers.pop(index, ()):
            r = self.requests[j]
            heapq.heappush(self.due, (max(r.arrival_s, end_s + r.think_s), j))

    def drain(self) -> list[int]:
        """Every request not sent yet (due, or waiting on one that has not ended)."""
        left = [i for _, i in self.due] + [j for js in self.followers.values() for j in js]
        self.due, self.followers, self.num_unsent = [], {}, 0
        return sorted(left)


def run_workload(
    backend: Backend,
    requests: tuple[BenchRequest, ...] | list[BenchRequest],
    options: RunOptions = RunOptions(),
    clock: Clock | None = None,
    monitor: GpuMonitor | None = None,
) -> RunResult:
    """`clock`: the one the backend stamps tokens with; default the backend's own `clock`
    attribute, else time.monotonic."""
    clock = clock or getattr(backend, "clock", None) or MonotonicClock()
    sends = _Sends(requests)
    ids = [f"{options.id_prefix}-{i}" for i in range(len(requests))]
    index = {rid: i for i, rid in enumerate(ids)}
    ended: dict[str, RequestRecord] = {}
    steps: list[StepSample] = []
    baseline = backend.stats()
    # disable=None: tqdm shows the bar on a terminal only, not in piped logs.
    bar = tqdm(total=len(requests), unit="req", desc=options.id_prefix,
               disable=None if options.progress else True, leave=False)
    if monitor is not None:
        monitor.start()
    t0 = clock.now()
    deadline = math.inf if options.max_duration_s is None else t0 + options.max_duration_s
    max_lag, aborted = 0.0, False
    try:
        while sends or backend.num_unfinished():
            now = clock.now()
            max_lag = max(max_lag, _send_due(backend, sends, ids, options, t0, now, deadline))
            if now >= deadline and not aborted:
                aborted = True
                for i in sends.drain():  # never sent: kept apart from the sent ones' figures
                    ended[ids[i]] = _unsent(ids[i], requests[i])
                backend.abort(ids)
            wait = _wait_s(backend, sends, options, now - t0, deadline - t0)
            if not backend.num_unfinished():
                clock.sleep(wait)
                continue
            for record in backend.poll(timeout_s=wait):
                ended[record.request_id] = rebased = record.rebased(t0)
                end_s = rebased.finish_s if rebased.finish_s is not None else clock.now() - t0
                sends.ended(index[record.request_id], end_s)
                bar.update(1)
            stats = backend.stats()
            if stats is not None:
                steps.append(StepSample(clock.now() - t0, stats))
    finally:
        bar.close()
        gpu = monitor.stop() if monitor is not None else None
    records = tuple(ended[rid] for rid in ids)
    duration = max((r.finish_s for r in records if r.finish_s is not None), default=0.0)
    return RunResult(records, tuple(steps), duration, baseline, gpu, max_lag)


_HELD_POLL_S = 1.0  # the longest a held request's wait polls before the loop looks again


def _send_due(backend: Backend, sends: _Sends, ids: list[str], options: RunOptions,
              t0: float, now: float, deadline: float) -> float:
    """Hands over what fell due before the limit (however late the runner is), as far as
    the concurrency cap lets it; returns the worst lag behind a due time."""
    lag = 0.0
    while (due := sends.next_due()) is not None and t0 + due <= min(now, deadline):
        if _full(backend, options):
            break  # held on the client until a request ends
        i = sends.pop()
        if options.max_concurrency is None:
            lag = max(lag, now - (t0 + due))
            backend.submit(ids[i], sends.requests[i], t0 + due)
        else:
            backend.submit(ids[i], sends.requests[i], now)  # timed from its send
    return lag


def _wait_s(backend: Backend, sends: _Sends, options: RunOptions, now_s: float,
            limit_s: float) -> float:
    """How long to wait (offsets from the start): for the next arrival or the limit,
    whichever comes first; while due requests are held, for a request's end (poll returns
    at one)."""
    due = sends.next_due()
    if due is None:
        return 0.05
    if due <= now_s and _full(backend, options):
        return min(limit_s - now_s, _HELD_POLL_S)
    return min(due, limit_s) - now_s


def _full(backend: Backend, options: RunOptions) -> bool:
    cap = options.max_concurrency
    return cap is not None and backend.num_unfinished() >= cap


def _unsent(request_id: str, request: BenchRequest) -> RequestRecord:
    return RequestRecord(
        request_id, request.prompt_len, request.output_len, request.arrival_s,
        None, (), None, None, 0, "not sent before the run's time limit", sent=False,
    )
