"""One benchmark: the same workload under each KV policy, a fresh backend (engine) per run.

    for policy: backend = factory(policy) -> warm-up -> timed run -> close
                [load sweep: the same at each rate -> goodput]
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from kvtier.bench.backend import Backend
from kvtier.bench.clock import Clock
from kvtier.bench.engine_backend import EngineBackend, EngineLike
from kvtier.bench.goodput import GoodputResult, goodput_bisect, goodput_grid
from kvtier.bench.gpu_monitor import GpuMonitor
from kvtier.bench.metrics import Slo, Summary, engine_summary, summarize_run
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, RunResult, run_workload
from kvtier.bench.workload import Workload, at_rate

BackendFactory = Callable[[str], Backend]  # policy name -> a fresh backend serving it
EngineFactory = Callable[[str], EngineLike]  # policy name -> a fresh in-process engine


def engine_backends(factory: EngineFactory, ignore_eos: bool = True,
                    clock: Clock | None = None) -> BackendFactory:
    """In-process backends; `clock` is the one the engines stamp tokens with."""
    return lambda policy: EngineBackend(factory(policy), ignore_eos, clock)


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
    # Free the closed engine's pools before the next engine claims the same GPU memory.
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:
        pass


def warm_up(backend: Backend, requests: tuple[BenchRequest, ...], num: int) -> None:
    """Run a few short requests to completion first: kernel compilation and allocator
    growth would otherwise land in the first measured requests' TTFT. Their prompts are
    the workload's first, so the prefix cache is emptied after them (they would hit)."""
    if num <= 0 or not requests:
        return
    warm = [replace(r, output_len=min(r.output_len, 8), arrival_s=0.0) for r in requests[:num]]
    run_workload(backend, warm, RunOptions(progress=False, id_prefix="warmup"))
    backend.reset_prefix_cache()


def run_once(factory: BackendFactory, policy: str, workload: Workload, config: BenchConfig,
             monitor: GpuMonitor | None) -> RunResult:
    backend = factory(policy)
    try:
        warm_up(backend, workload.requests, config.warmup_requests)
        options = replace(config.run, id_prefix=policy)
        return run_workload(backend, workload.requests, options, monitor=monitor)
    finally:
        backend.close()
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
        "num_sent": summary.num_sent,
        "num_not_sent": summary.num_not_sent,
        "attainment_all": summary.slo_attainment_all,
        "num_preemptions": engine.get("num_preemptions"),
    }


def sweep_goodput(factory: BackendFactory, policy: str, workload: Workload, config: BenchConfig,
                  log: Callable[[str], None]) -> GoodputResult:
    sweep, slo = config.sweep, config.slo
    if sweep is None or slo is None:
        raise ValueError("a goodput sweep needs a SweepConfig and SLOs (--slo-ttft/--slo-tpot)")

    def run_at(rate: float) -> tuple[float, dict]:
        result = run_once(factory, policy, at_rate(workload, rate), config, None)
        summary = summarize_run(result, slo)
        unsent = f", {summary.num_not_sent} not sent" if summary.num_not_sent else ""
        log(f"  {policy} @ {rate:.3g} req/s: SLO attainment {summary.slo_attainment:.1%} of "
            f"{summary.num_sent} sent{unsent}")
        return summary.slo_attainment or 0.0, probe_figures(summary, engine_summary(result))

    if sweep.rates:
        return goodput_grid(run_at, sweep.rates, sweep.target)
    return goodput_bisect(run_at, sweep.low, sweep.high, sweep.target, sweep.rel_tol)


def run_experiment(workload: Workload, factory: BackendFactory, config: BenchConfig,
                   log: Callable[[str], None] = print) -> list[PolicyResult]:
    monitor = GpuMonitor.create() if config.monitor_gpu else None
    results = []
    for policy in config.policies:
        log(f"[{policy}] {len(workload.requests)} requests")
        run = run_once(factory, policy, workload, config, monitor)
        goodput = None
        if config.sweep is not None:
            goodput = sweep_goodput(factory, policy, workload, config, log)
        summary = summarize_run(run, config.slo)
        results.append(PolicyResult(policy, run, summary, engine_summary(run), goodput))
    return results
