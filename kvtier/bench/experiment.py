"""One benchmark: the same workload under each KV policy, a fresh engine per run.

    for policy: engine = factory(policy) -> warm-up -> timed run -> [load sweep -> goodput]
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvtier.bench.clock import Clock
from kvtier.bench.engine_backend import EngineBackend, EngineLike
from kvtier.bench.goodput import GoodputResult, goodput_bisect, goodput_grid
from kvtier.bench.gpu_monitor import GpuMonitor
from kvtier.bench.metrics import Slo, Summary, engine_summary, slo_attainment, summarize_run
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, RunResult, run_workload
from kvtier.bench.workload import Workload, at_rate

EngineFactory = Callable[[str], EngineLike]  # policy name -> a fresh engine


@dataclass(frozen=True)
class SweepConfig:
    """Goodput search: a grid of rates when given (also the throughput-vs-load plot),
    else bisection between `low` and `high`."""

    rates: tuple[float, ...] = ()
    low: float = 0.5
    high: float = 64.0
    rel_tol: float = 0.1
    target: float = 0.9


@dataclass(frozen=True)
class BenchConfig:
    policies: tuple[str, ...]
    slo: Slo | None = None
    warmup_requests: int = 2
    ignore_eos: bool = True
    run: RunOptions = RunOptions()
    sweep: SweepConfig | None = None
    monitor_gpu: bool = True


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    run: RunResult = field(repr=False)
    summary: Summary
    engine: dict  # engine_summary(run)
    goodput: GoodputResult | None = None


def _free_memory() -> None:
    # Free the dropped engine's pools before the next engine claims the same GPU memory.
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def warm_up(engine: EngineLike, requests: tuple[BenchRequest, ...], num: int, ignore_eos: bool,
            clock: Clock | None = None) -> None:
    """Run a few short requests to completion first: kernel compilation and allocator
    growth would otherwise land in the first measured requests' TTFT."""
    if num <= 0 or not requests:
        return
    warm = [replace(r, output_len=min(r.output_len, 8), arrival_s=0.0) for r in requests[:num]]
    run_workload(EngineBackend(engine, ignore_eos, clock), warm,
                 RunOptions(progress=False, id_prefix="warmup"), clock=clock)


def run_once(factory: EngineFactory, policy: str, workload: Workload, config: BenchConfig,
             monitor: GpuMonitor | None, clock: Clock | None = None) -> RunResult:
    """`clock` is the one the engines stamp tokens with (None: time.monotonic)."""
    engine = factory(policy)
    try:
        warm_up(engine, workload.requests, config.warmup_requests, config.ignore_eos, clock)
        options = replace(config.run, id_prefix=policy)
        return run_workload(EngineBackend(engine, config.ignore_eos, clock), workload.requests,
                            options, clock=clock, monitor=monitor)
    finally:
        del engine  # the only reference: the engine and its KV pools go now
        _free_memory()


def probe_figures(summary: Summary, engine: dict) -> dict:
    """What a load-sweep point keeps (the plots read these keys)."""
    return {
        "request_throughput": summary.request_throughput,
        "output_throughput": summary.output_throughput,
        "ttft_p50_s": summary.ttft_s.p50 if summary.ttft_s else None,
        "ttft_p90_s": summary.ttft_s.p90 if summary.ttft_s else None,
        "tpot_p50_s": summary.tpot_s.p50 if summary.tpot_s else None,
        "tpot_p90_s": summary.tpot_s.p90 if summary.tpot_s else None,
        "e2e_p50_s": summary.e2e_s.p50 if summary.e2e_s else None,
        "num_completed": summary.num_completed,
        "num_preemptions": engine.get("num_preemptions"),
    }


def sweep_goodput(factory: EngineFactory, policy: str, workload: Workload, config: BenchConfig,
                  log: Callable[[str], None], clock: Clock | None = None) -> GoodputResult:
    sweep, slo = config.sweep, config.slo
    if sweep is None or slo is None:
        raise ValueError("a goodput sweep needs a SweepConfig and SLOs (--slo-ttft/--slo-tpot)")

    def run_at(rate: float) -> tuple[float, dict]:
        result = run_once(factory, policy, at_rate(workload, rate), config, None, clock)
        summary = summarize_run(result, slo)
        attainment = slo_attainment(result.records, slo)
        log(f"  {policy} @ {rate:.3g} req/s: SLO attainment {attainment:.1%}")
        return attainment, probe_figures(summary, engine_summary(result))

    if sweep.rates:
        return goodput_grid(run_at, sweep.rates, sweep.target)
    return goodput_bisect(run_at, sweep.low, sweep.high, sweep.target, sweep.rel_tol)


def run_experiment(workload: Workload, factory: EngineFactory, config: BenchConfig,
                   log: Callable[[str], None] = print, clock: Clock | None = None) -> list[PolicyResult]:
    monitor = GpuMonitor.create() if config.monitor_gpu else None
    results = []
    for policy in config.policies:
        log(f"[{policy}] {len(workload.requests)} requests")
        run = run_once(factory, policy, workload, config, monitor, clock)
        goodput = None
        if config.sweep is not None:
            goodput = sweep_goodput(factory, policy, workload, config, log, clock)
        results.append(PolicyResult(policy, run, summarize_run(run, config.slo), engine_summary(run), goodput))
    return results
