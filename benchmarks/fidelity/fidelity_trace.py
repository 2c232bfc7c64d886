"""A fidelity trace and its replay: the recorded run's workload (the prepared requests with
the same gamma arrivals), its engine configuration, its per-request rows, and the same trace
run through the simulator. What every fidelity script shares, below all of them."""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec, arrival_offsets
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, RunResult, run_workload
from kvtier.costmodel.calibration import Calibration
from kvtier.engine.args import EngineArgs
from kvtier.sim.engine import build_sim_engine


def load_requests(path: str, num: int, rate: float, cv: float, seed: int) -> list[BenchRequest]:
    """The prepared workload's first `num` requests with gamma arrivals."""
    rows = json.loads(Path(path).read_text())["requests"][:num]
    offsets = arrival_offsets(ArrivalSpec(ArrivalKind.GAMMA, rate=rate, cv=cv), len(rows), seed)
    return [BenchRequest(tuple(p), int(o), float(t)) for (p, o), t in zip(rows, offsets)]


def engine_args(a: dict) -> EngineArgs:
    return EngineArgs(model=a["model"], load_format="dummy", max_model_len=a["max_model_len"],
                      max_num_seqs=a["max_num_seqs"], kv_policy=a["kv_policy"],
                      num_gpu_blocks=a.get("num_gpu_blocks"),
                      num_host_blocks=a.get("num_host_blocks"),
                      piecewise_graphs=a.get("piecewise_graphs", False))


def request_rows(result: RunResult) -> list[list]:
    """[prompt, output, arrival, ttft, tpot, e2e, preemptions] per request."""
    return [[r.prompt_len, r.output_len, r.arrival_s, r.ttft_s, r.tpot_s, r.e2e_s,
             r.num_preemptions] for r in result.records]


def simulate(real: dict, calib: Calibration):
    cfg, wl = real["config"], real["workload"]
    reqs = load_requests(wl["path"], wl["num_requests"], wl["rate"], wl["cv"], wl["seed"])
    engine = build_sim_engine(engine_args(cfg), "h200", calib, record_steps=True)
    clock = engine.clock
    result = run_workload(EngineBackend(engine, clock=clock), reqs, RunOptions(progress=False),
                          clock=clock)
    return engine, result
