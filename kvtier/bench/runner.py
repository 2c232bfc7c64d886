"""Plays a workload against a backend in real time and records what happened.

Open loop: each request is submitted at its arrival offset whatever the backend is doing
(its arrival time is the due time, so a late submission still counts as queueing), and the
engine's state is sampled after every step.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from tqdm import tqdm

from kvtier.bench.backend import Backend, RequestRecord
from kvtier.bench.clock import Clock, MonotonicClock
from kvtier.bench.gpu_monitor import GpuMonitor, GpuSummary
from kvtier.bench.request import BenchRequest
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
    order = sorted(range(len(requests)), key=lambda i: requests[i].arrival_s)
    pending = deque(order)
    ids = [f"{options.id_prefix}-{i}" for i in range(len(requests))]
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
        while pending or backend.num_unfinished():
            now = clock.now()
            # Only what fell due before the limit is sent, however late the runner is.
            while pending and t0 + requests[pending[0]].arrival_s <= min(now, deadline):
                i = pending.popleft()
                due = t0 + requests[i].arrival_s
                max_lag = max(max_lag, now - due)
                backend.submit(ids[i], requests[i], due)
            if now >= deadline and not aborted:
                aborted = True
                for i in pending:  # never sent: kept apart from the sent ones' figures
                    ended[ids[i]] = _unsent(ids[i], requests[i])
                pending.clear()
                backend.abort(ids)
            # Wake for the next arrival or the limit, whichever comes first.
            wait = min(t0 + requests[pending[0]].arrival_s, deadline) - now if pending else 0.05
            if not backend.num_unfinished():
                clock.sleep(wait)
                continue
            for record in backend.poll(timeout_s=wait):
                ended[record.request_id] = record.rebased(t0)
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


def _unsent(request_id: str, request: BenchRequest) -> RequestRecord:
    return RequestRecord(
        request_id, request.prompt_len, request.output_len, request.arrival_s,
        None, (), None, None, 0, "not sent before the run's time limit", sent=False,
    )
