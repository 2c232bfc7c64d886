"""Measuring the engine loop's host time outside the executor (schedule, KV manager, update,
outputs, the bench runner's bookkeeping) on this CPU: the same loop the real benchmark runs,
with the simulated executor, whose own time is subtracted."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np

from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.engine.args import EngineArgs
from kvtier.profiler.recording import RecordingExecutor, loop_overheads
from kvtier.sim.clock import VirtualClock
from kvtier.sim.engine import build_sim_engine

_BIN = 16  # requests per bin: medians per bin keep GC pauses out of the fit


def loop_workload(num_requests: int, vocab: int, max_len: int, seed: int = 0) -> list[BenchRequest]:
    """ShareGPT-like lengths (log-normal prompts ~250, outputs ~200 tokens), arriving at a
    pace that sweeps the running batch from one request to the seat limit and back."""
    rng = random.Random(seed)
    reqs, t = [], 0.0
    for _ in range(num_requests):
        p = max(4, min(max_len // 2, int(rng.lognormvariate(5.2, 0.9))))
        o = max(4, min(max_len - p - 1, int(rng.lognormvariate(5.0, 0.8))))
        reqs.append(BenchRequest(tuple(rng.randrange(vocab) for _ in range(p)), o, t))
        t += rng.expovariate(40.0)
    return reqs


def measure_loop_overhead(args: EngineArgs, num_requests: int = 600,
                          seed: int = 0) -> list[list[float]]:
    """Rows [scheduled requests, sampled requests, seconds]: per-bin medians."""
    clock = VirtualClock()
    engine = build_sim_engine(replace(args, device="cpu"), "h200", clock=clock)
    recorder = RecordingExecutor(engine.executor)
    engine.executor = recorder
    reqs = loop_workload(num_requests, engine.model_config.vocab_size,
                         engine.config.scheduler.max_model_len, seed)
    run_workload(EngineBackend(engine, ignore_eos=True, clock=clock), reqs,
                 RunOptions(progress=False), clock=clock)
    bins: dict[int, list[tuple[int, int, float]]] = {}
    for shape, sec in loop_overheads(recorder.records):
        if shape.num_reqs:
            bins.setdefault(shape.num_reqs // _BIN, []).append(
                (shape.num_reqs, shape.num_sampled, sec))
    rows = []
    for items in bins.values():
        a = np.array(items, float)
        rows.append([float(np.median(a[:, 0])), float(np.median(a[:, 1])),
                     float(np.median(a[:, 2]))])
    return sorted(rows)
