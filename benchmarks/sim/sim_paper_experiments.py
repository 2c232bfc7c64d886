"""The eLLM paper's experiments (EuroSys'26, section 7) on the simulator: kvtier's real
scheduler, KV manager and policies on the cost model's virtual clock, driven through the
bench harness (`kvtier/bench/experiment.py`, the machinery of `kvtier bench --simulate`).

llama-2-13b, policies recompute / swap / hcache / ellm (eLLM's default adaptive mode: prefixes
dropped on demand within the step's recompute budget, priced by the calibrated cost model) /
ellm-planned (the request-level planner picks r), KV pool 40 GiB (the paper's pressure on an A100-80GB),
host pool 40 GiB (the paper's swap space for 13B), SLO TTFT 2 s / TPOT 100 ms (the bench
defaults; the paper states no numbers).

  e2e      3,000 ShareGPT requests, gamma arrivals with the Azure trace's CV 1.69 at 50 req/s
           (the paper's ShareGPT rate): throughput, TTFT/TPOT p50/p90, SLO attainment,
           running requests over time (5 s bins, as the paper samples). --gpu a100-80gb for
           the paper's GPU (datasheet roofline, the H200 calibration scaled by it).
  load     the same arrival process at 0.1x-3x of 50 req/s (1,000 requests a point):
           the harness's goodput grid per policy (>= 90 % inside both SLOs).
  leval    L-Eval paper-assistant prompts that fit 32k tokens, gaps doubled (12.5 req/s,
           the paper's L-Eval rate), SLO TTFT 10 s / TPOT 200 ms.
  fsweep   F = layers_per_block 2 / 4 / 8 under recompute and ellm: throughput, block
           fragmentation (KVCacheManager.gpu_slot_usage after every step) and map-table
           time (time.perf_counter around every KV-manager call the engine makes in a step,
           outermost calls only; this CPU's time, not the simulated GPU's).
  planner  the cost-model perturbation (+-20 %) of the ellm planner: runs
           benchmarks/sim/sim_ellm_sweeps.py, which writes results/sim/sim_ellm_sweeps.json.
  all      every one of the above.

  PYTHONPATH=. .venv/bin/python -m benchmarks.sim.sim_paper_experiments all
  PYTHONPATH=. .venv/bin/python -m benchmarks.sim.sim_paper_experiments e2e --gpu a100-80gb

Workloads: `.carry/sharegpt_llama2_13b_3000.json` from `benchmarks/prepare_workload.py
--model llama-2-13b --num-prompts 3000 --out ...`; L-Eval from
/work/shared/data/leval_paper_assistant.jsonl (or --leval-path).
Each writes <name>.json (benchmarks/common.write_result) and PNGs beside it under
results/sim/sim_paper/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks.common import write_result  # noqa: E402
from kvtier.bench.arrivals import PAPER_AZURE_CV, ArrivalKind, ArrivalSpec  # noqa: E402
from kvtier.bench.experiment import (  # noqa: E402
    BenchConfig,
    PolicyResult,
    SweepConfig,
    engine_backends,
    run_experiment,
    sweep_goodput,
)
from kvtier.bench.metrics import Slo  # noqa: E402
from kvtier.bench.plots import plot_latency_cdfs, plot_load_sweep, plot_timeseries  # noqa: E402
from kvtier.bench.report import policy_dict  # noqa: E402
from kvtier.bench.request import LengthLimits  # noqa: E402
from kvtier.bench.runner import RunOptions, RunResult  # noqa: E402
from kvtier.bench.workload import Dataset, Workload, WorkloadSpec, build_workload  # noqa: E402
from kvtier.costmodel.hardware import CopyCost, CopyMechanism  # noqa: E402
from kvtier.engine.args import EngineArgs  # noqa: E402
from kvtier.sim import VirtualClock, build_sim_engine  # noqa: E402

POLICIES = ("recompute", "swap", "hcache", "ellm", "ellm-planned")
OUT_DIR = Path("results/sim/sim_paper")
SHAREGPT = ".carry/sharegpt_llama2_13b_3000.json"
LEVAL = "/work/shared/data/leval_paper_assistant.jsonl"
CALIBRATION = "results/calibration/calib_h200_llama-2-13b.json"
BIN_S = 5.0  # the paper samples concurrency every 5 s


# ---- engines and workloads ---------------------------------------------------------------------
def engine_args(a: argparse.Namespace, policy: str, **over) -> EngineArgs:
    """`policy` may be ELLM_PLANNED: ellm with the request-level planner."""
    planned = policy == ELLM_PLANNED
    base = EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=a.max_model_len,
                      kv_cache_gb=a.kv_cache_gb, swap_space=a.swap_space,
                      max_num_seqs=a.max_num_seqs, kv_policy="ellm" if planned else policy,
                      ellm_planner=planned, ellm_tpot_slo_ms=a.slo_tpot,
                      ellm_recompute_budget=a.ellm_recompute_budget)
    return replace(base, **over)


def sim_factory(a: argparse.Namespace, clock: VirtualClock, gpu: str,
                wrap: Callable | None = None, **over):
    """policy -> a fresh simulated engine on the shared clock (as `kvtier bench --simulate`).
    "swap-pcie" is swap with its copies priced at the link (see `swap_at_pcie`);
    "ellm-planned" is ellm with the request-level planner."""
    def engine(label: str):
        policy = "swap" if label == SWAP_PCIE else label
        e = build_sim_engine(engine_args(a, policy, **over), gpu, a.calibration, clock=clock)
        if label == SWAP_PCIE:
            swap_at_pcie(e)
        return wrap(label, e) if wrap is not None else e
    return engine_backends(engine, ignore_eos=True, clock=clock)


SWAP_PCIE = "swap-pcie"
ELLM_PLANNED = "ellm-planned"


def swap_at_pcie(engine) -> None:
    """Price swap copies at the simulated GPU's PCIe link, one cudaMemcpyAsync per block
    (its measured 7.4 us per call on the H200 plus the bytes at 55 GB/s), instead of the
    calibration's measured curve, which timed the old pageable staging path (~1 GB/s for
    256 blocks) that the per-block pinned copies replaced and that has not been re-measured."""
    cm = engine.executor.cost_model
    if cm.calib is None:
        return
    bb = cm.config.block_bytes
    per_block = {d: c[CopyMechanism.MEMCPY_PER_PAGE] for d, c in (("out", cm.hw.d2h),
                                                                    ("in", cm.hw.h2d))}
    affine = {d: CopyCost(c.alpha_s_per_byte + c.beta_s / bb, 0.0) for d, c in per_block.items()}
    cm.calib = replace(cm.calib, copy_out_blocks=None, copy_in_blocks=None,
                       copy_out=affine["out"], copy_in=affine["in"])


def bench_config(a: argparse.Namespace, policies, slo: Slo, sweep: SweepConfig | None = None):
    # No warm-up: a simulator compiles no kernels.
    return BenchConfig(policies=tuple(policies), slo=slo, warmup_requests=0,
                       run=RunOptions(progress=False), sweep=sweep, monitor_gpu=False)


def sharegpt_workload(a: argparse.Namespace, num: int, rate: float) -> Workload:
    spec = WorkloadSpec(Dataset.PREPARED, num, ArrivalSpec(ArrivalKind.GAMMA, rate=rate,
                                                           cv=PAPER_AZURE_CV),
                        seed=0, path=a.workload, limits=LengthLimits())
    return build_workload(spec, None, 32000)


def leval_workload(a: argparse.Namespace) -> Workload:
    from kvtier.bench.cli import _tokenizer_and_config

    tok, cfg = _tokenizer_and_config(engine_args(a, "recompute", max_model_len=a.leval_max_len))
    limits = LengthLimits(max_prompt_len=a.leval_max_len - 1, max_total_len=a.leval_max_len)
    spec = WorkloadSpec(Dataset.LEVAL, a.leval_prompts,
                        ArrivalSpec(ArrivalKind.GAMMA, rate=a.leval_rate, cv=PAPER_AZURE_CV),
                        seed=0, path=a.leval_path, limits=limits)
    return build_workload(spec, tok, cfg.model_config.vocab_size)


# ---- figures -----------------------------------------------------------------------------------
def running_timeline(run: RunResult, bin_s: float = BIN_S) -> dict:
    """Running requests, step-time-weighted mean per `bin_s` of virtual time."""
    if not run.steps:
        return {"bin_s": bin_s, "t_s": [], "running": []}
    t = np.array([s.t_s for s in run.steps])
    w = np.array([max(s.stats.step_time_s, 1e-9) for s in run.steps])
    r = np.array([s.stats.num_running for s in run.steps], float)
    bins = (t // bin_s).astype(int)
    n = bins.max() + 1
    sw = np.bincount(bins, w, n)
    mean = np.divide(np.bincount(bins, w * r, n), sw, out=np.full(n, np.nan), where=sw > 0)
    return {"bin_s": bin_s, "t_s": [float(i * bin_s) for i in range(n)],
            "running": [None if np.isnan(x) else round(float(x), 2) for x in mean]}


def headline(res: PolicyResult) -> dict:
    s, e = res.summary, res.engine
    steps = res.run.steps
    dropped = [st.stats.num_dropped_tokens for st in steps]
    return {
        "output_tok_s": s.output_throughput,
        "request_s": s.request_throughput,
        "ttft_p50_s": s.ttft_s.p50, "ttft_p90_s": s.ttft_s.p90,
        "tpot_p50_s": s.tpot_s.p50, "tpot_p90_s": s.tpot_s.p90,
        "tpot_mean_s": s.tpot_s.mean,
        "slo_attainment": s.slo_attainment,
        "ttft_attainment": s.ttft_attainment, "tpot_attainment": s.tpot_attainment,
        "duration_s": s.duration_s,
        "mean_running": e.get("mean_running"), "max_running": e.get("max_running"),
        "preemptions": e.get("num_preemptions"),
        "swap_out_blocks": e.get("num_swap_out_blocks"),
        "recomputed_tokens": e.get("num_recomputed_tokens"),
        "prefix_recompute_tokens": e.get("num_prefix_recompute_tokens"),
        "restored_tokens": e.get("num_restored_tokens"),
        "mean_dropped_tokens": float(np.mean(dropped)) if dropped else 0.0,
        "mean_gpu_kv_use": e.get("mean_gpu_kv_use"),
        "num_steps": e.get("num_steps"),
    }


def ratios_to(rows: dict, of: str = "ellm") -> dict:
    """ellm's throughput and TTFT p50 against each baseline (the paper's 'x times')."""
    if of not in rows:
        return {}
    me = rows[of]
    return {p: {"throughput_x": me["output_tok_s"] / r["output_tok_s"],
                "ttft_p50_lower_x": r["ttft_p50_s"] / me["ttft_p50_s"]}
            for p, r in rows.items() if p != of}


def policy_payload(results: list[PolicyResult]) -> dict:
    rows = {r.policy: headline(r) for r in results}
    return {"policies": rows, "ellm_vs": ratios_to(rows),
            "running_timeline": {r.policy: running_timeline(r.run) for r in results},
            "harness": {r.policy: policy_dict(r) for r in results}}


def workload_info(w: Workload) -> dict:
    return {"spec": w.spec.to_dict(), **w.summary()}


def save(name: str, payload: dict, a: argparse.Namespace) -> Path:
    path = Path(a.out_dir) / f"{name}.json"
    write_result(path, {"experiment": name, "model": "llama-2-13b",
                        "calibration": a.calibration, **payload})
    return path


def _print_rows(title: str, rows: dict) -> None:
    print(title)
    for p, r in rows.items():
        print(f"  {p:10s} {r['output_tok_s']:8.0f} tok/s  TTFT p50 {r['ttft_p50_s']:7.2f} s"
              f" p90 {r['ttft_p90_s']:7.2f}  TPOT p50 {1e3 * r['tpot_p50_s']:6.1f} ms"
              f" p90 {1e3 * r['tpot_p90_s']:6.1f}  SLO {r['slo_attainment']:.1%}"
              f"  running {r['mean_running']:.0f} (max {r['max_running']})", flush=True)


# ---- 1. end to end -----------------------------------------------------------------------------
def exp_e2e(a: argparse.Namespace) -> None:
    w = sharegpt_workload(a, a.num_prompts, a.rate)
    slo = Slo(a.slo_ttft / 1e3, a.slo_tpot / 1e3)
    t0 = time.perf_counter()
    results = run_experiment(w, sim_factory(a, VirtualClock(), a.gpu),
                             bench_config(a, a.policies, slo), log=lambda s: None)
    wall = time.perf_counter() - t0
    name = f"e2e_{a.gpu}"
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    runs = {r.policy: r.run for r in results}
    plot_latency_cdfs(runs, out / f"{name}_latency_cdf.png")
    plot_timeseries(runs, out / f"{name}_kv_and_running.png")
    payload = {"gpu": a.gpu, "workload": workload_info(w), "slo_ms": [a.slo_ttft, a.slo_tpot],
               "kv_cache_gb": a.kv_cache_gb, "swap_space_gb": a.swap_space,
               "max_num_seqs": a.max_num_seqs, "wall_s": wall, **policy_payload(results)}
    save(name, payload, a)
    _print_rows(f"{name}: {len(w.requests)} requests, wall {wall:.1f} s", payload["policies"])


# ---- 2. load sweep -----------------------------------------------------------------------------
def exp_load(a: argparse.Namespace) -> None:
    w = sharegpt_workload(a, a.load_prompts, a.rate)
    slo = Slo(a.slo_ttft / 1e3, a.slo_tpot / 1e3)
    rates = tuple(m * a.rate for m in a.load_multiples)
    config = bench_config(a, a.policies, slo, SweepConfig(rates=rates))
    factory = sim_factory(a, VirtualClock(), a.gpu)
    t0 = time.perf_counter()
    sweeps = {p: sweep_goodput(factory, p, w, config, log=print) for p in a.policies}
    wall = time.perf_counter() - t0
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"load_{a.gpu}"
    plot_load_sweep(sweeps, out / f"{name}.png")
    payload = {"gpu": a.gpu, "workload": workload_info(w), "slo_ms": [a.slo_ttft, a.slo_tpot],
               "base_rate": a.rate, "multiples": list(a.load_multiples), "wall_s": wall,
               "goodput_req_s": {p: g.rate for p, g in sweeps.items()},
               "sweeps": {p: g.to_dict() for p, g in sweeps.items()}}
    save(name, payload, a)
    for p, g in sweeps.items():
        print(f"  {p:10s} goodput {g.rate} req/s; attainment "
              + ", ".join(f"{pr.rate:g}:{pr.attainment:.0%}" for pr in sorted(g.probes,
                                                                            key=lambda x: x.rate)))


# ---- 3. long context ---------------------------------------------------------------------------
def exp_leval(a: argparse.Namespace) -> None:
    os.environ.setdefault("KVTIER_ALLOW_LONG_MAX_MODEL_LEN", "1")  # llama-2 past 4k positions
    w = leval_workload(a)
    slo = Slo(a.leval_slo_ttft / 1e3, a.leval_slo_tpot / 1e3)
    t0 = time.perf_counter()
    factory = sim_factory(a, VirtualClock(), a.gpu, max_model_len=a.leval_max_len,
                          max_num_seqs=a.leval_max_num_seqs, ellm_tpot_slo_ms=a.leval_slo_tpot)
    results = run_experiment(w, factory, bench_config(a, a.policies, slo), log=lambda s: None)
    wall = time.perf_counter() - t0
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"leval_{a.gpu}"
    runs = {r.policy: r.run for r in results}
    plot_latency_cdfs(runs, out / f"{name}_latency_cdf.png")
    plot_timeseries(runs, out / f"{name}_kv_and_running.png")
    payload = {"gpu": a.gpu, "workload": workload_info(w),
               "slo_ms": [a.leval_slo_ttft, a.leval_slo_tpot], "max_model_len": a.leval_max_len,
               "max_num_seqs": a.leval_max_num_seqs, "kv_cache_gb": a.kv_cache_gb,
               "swap_space_gb": a.swap_space, "wall_s": wall, **policy_payload(results)}
    save(name, payload, a)
    _print_rows(f"{name}: {len(w.requests)} requests, wall {wall:.1f} s", payload["policies"])


# ---- 4. F sweep --------------------------------------------------------------------------------
_KV_CALLS = ("allocate_slots", "block_table", "free", "blocks_needed", "swap_out", "swap_in",
             "can_swap_in", "hide", "unhide", "can_unhide", "num_dropped_tokens", "drop_prefix")


@dataclass
class Probe:
    """Per engine step: the KV manager's CPU time inside the step, its slot usage after it."""

    map_table_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)  # simulated (virtual) step time
    allocated: list[int] = field(default_factory=list)
    filled: list[int] = field(default_factory=list)
    calls: int = 0


def instrument(engine, probe: Probe):
    """Time every KV-manager call made during engine.step() (outermost only: manager methods
    call each other) and read gpu_slot_usage after every step. The scheduler looks the
    methods up on the instance each step, so wrapping the instance's attributes sees all."""
    kv, sched = engine.kv_manager, engine.scheduler
    state = {"depth": 0, "acc": 0.0, "in_step": False}
    clock = time.perf_counter

    def timed(fn):
        def call(*args, **kw):
            if not state["in_step"] or state["depth"]:
                return fn(*args, **kw)
            state["depth"] = 1
            t = clock()
            try:
                return fn(*args, **kw)
            finally:
                state["acc"] += clock() - t
                state["depth"] = 0
                probe.calls += 1
        return call

    for name in _KV_CALLS:
        setattr(kv, name, timed(getattr(kv, name)))
    step, vclock = engine.step, engine.clock

    def instrumented_step():
        state["acc"], state["in_step"] = 0.0, True
        t = vclock()
        try:
            return step()
        finally:
            state["in_step"] = False
            probe.step_s.append(vclock() - t)
            probe.map_table_s.append(state["acc"])
            alloc, filled = kv.gpu_slot_usage(sched.running)
            probe.allocated.append(alloc)
            probe.filled.append(filled)

    engine.step = instrumented_step
    return engine


def probe_summary(p: Probe) -> dict:
    alloc, filled = np.array(p.allocated, float), np.array(p.filled, float)
    w = np.array(p.step_s)
    frag = np.divide(alloc - filled, alloc, out=np.zeros_like(alloc), where=alloc > 0)
    mt = np.array(p.map_table_s)
    return {
        "steps": len(mt), "kv_calls": p.calls,
        "fragmentation_mean": float(np.average(frag, weights=w)) if w.sum() else None,
        "fragmentation_pooled": float((alloc - filled).sum() / alloc.sum()) if alloc.sum() else None,
        "map_table_ms_per_step_mean": 1e3 * float(mt.mean()),
        "map_table_ms_per_step_p50": 1e3 * float(np.percentile(mt, 50)),
        "map_table_ms_per_step_p90": 1e3 * float(np.percentile(mt, 90)),
        "map_table_ms_per_step_max": 1e3 * float(mt.max()),
        "map_table_share_of_sim_time": float(mt.sum() / w.sum()) if w.sum() else None,
    }


def exp_fsweep(a: argparse.Namespace) -> None:
    w = sharegpt_workload(a, a.num_prompts, a.rate)
    slo = Slo(a.slo_ttft / 1e3, a.slo_tpot / 1e3)
    rows: list[dict] = []
    t0 = time.perf_counter()
    for f in a.f_values:
        probes: dict[str, Probe] = {}

        def wrap(policy, engine, probes=probes):
            probes[policy] = Probe()
            return instrument(engine, probes[policy])

        factory = sim_factory(a, VirtualClock(), a.gpu, wrap, layers_per_block=f)
        results = run_experiment(w, factory, bench_config(a, a.f_policies, slo),
                                 log=lambda s: None)
        for r in results:
            rows.append({"layers_per_block": f, "policy": r.policy, **headline(r),
                         **probe_summary(probes[r.policy])})
            x = rows[-1]
            print(f"  F={f} {r.policy:10s} {x['output_tok_s']:7.0f} tok/s  frag "
                  f"{x['fragmentation_mean']:.2%}  map table {x['map_table_ms_per_step_mean']:.3f}"
                  f" ms/step ({x['map_table_share_of_sim_time']:.2%} of sim time)", flush=True)
    wall = time.perf_counter() - t0
    for r in rows:  # throughput relative to F = 4, the paper's normalisation point
        ref = next((x for x in rows if x["policy"] == r["policy"]
                    and x["layers_per_block"] == 4), None)
        r["throughput_vs_f4"] = r["output_tok_s"] / ref["output_tok_s"] if ref else None
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    name = f"fsweep_{a.gpu}"
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    keys = (("output_tok_s", "output tok/s (simulated)"),
            ("fragmentation_mean", "block fragmentation (unfilled / allocated slots)"),
            ("map_table_ms_per_step_mean", "map-table CPU time per step (ms, this CPU)"))
    for ax, (key, title) in zip(axes, keys):
        for p in a.f_policies:
            pts = [(r["layers_per_block"], r[key]) for r in rows if r["policy"] == p]
            ax.plot(*zip(*pts), "o-", label=p)
        ax.set_xlabel("F (layers per block)")
        ax.set_xticks(list(a.f_values))
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(f"F sweep, llama-2-13b, {len(w.requests)} ShareGPT requests at {a.rate:g} req/s,"
                 f" simulated {a.gpu}")
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=100)
    plt.close(fig)
    save(name, {"gpu": a.gpu, "workload": workload_info(w), "kv_cache_gb": a.kv_cache_gb,
                "max_num_seqs": a.max_num_seqs, "wall_s": wall,
                "map_table_calls_timed": list(_KV_CALLS), "rows": rows}, a)


# ---- the physics behind them: the cost model's prices -------------------------------------------
def exp_physics(a: argparse.Namespace) -> None:
    """What recomputing a dropped prefix costs per step against what it frees, and what
    swapping the same KV over PCIe costs once, from the simulated engine's cost model."""
    from kvtier.costmodel.shape import StepShape

    e = build_sim_engine(engine_args(a, "ellm"), a.gpu, a.calibration)
    cm, mc = e.executor.cost_model, e.model_config
    ctx = a.physics_ctx
    kv_token = mc.kv_bytes_per_token(2)
    hw = cm.hw
    rows = []
    for b in (32, 64, 128, 192, 256):
        base = cm.predict(StepShape(b, b * ctx, ctx, (), b)).executor_s
        for total in (0, 16 * 4, 180, 512, 1024, 2048, 4096):
            # whole 16-token blocks: k requests recompute `per` prefix tokens each
            per = max(16, total // b) if total else 0
            k = min(b, total // per) if total else 0
            pre = tuple((per, 0) for _ in range(k))
            t = cm.predict(StepShape(b, b * ctx, ctx, pre, b)).executor_s if k else base
            rows.append({"batch": b, "context": ctx, "recompute_tokens": k * per,
                         "step_ms": 1e3 * t, "extra_ms": 1e3 * (t - base),
                         "extra_us_per_recompute_token": 1e6 * (t - base) / (k * per) if k else None,
                         "kv_freed_mib": k * per * kv_token / 2**20})
    flops_per_token = 2 * mc.num_params()
    d2h = hw.d2h[CopyMechanism.BULK]
    h2d = hw.h2d[CopyMechanism.BULK]
    payload = {
        "gpu": hw.name, "kv_bytes_per_token": kv_token,
        "ridge_flop_per_byte": hw.bf16_flops / hw.hbm_bytes_per_s,
        # tokens a step puts through the weights before the linear layers turn compute-bound:
        # 2 FLOP per weight per token against 2 bytes per weight read
        "ridge_tokens_per_step": hw.bf16_flops / hw.hbm_bytes_per_s,
        "recompute_us_per_token_at_gemm_peak": 1e6 * flops_per_token / hw.bf16_flops,
        "pcie_out_and_in_us_per_token": 1e6 * (d2h.alpha_s_per_byte + h2d.alpha_s_per_byte) * kv_token,
        "ellm_max_recompute_tokens_per_step": e.config.policy_options.max_recompute_tokens,
        "ellm_step_budget": step_budget_rows(e, ctx),
        "rows": rows,
    }
    save(f"physics_{a.gpu}", payload, a)
    fig, ax = plt.subplots(figsize=(7, 4))
    for b in sorted({r["batch"] for r in rows}):
        pts = [(r["recompute_tokens"], r["step_ms"]) for r in rows if r["batch"] == b]
        ax.plot(*zip(*pts), "o-", label=f"{b} decodes, ctx {ctx}")
    ax.axvline(payload["ridge_tokens_per_step"], ls=":", color="grey")
    ax.set_xscale("symlog", linthresh=64)
    ax.set_xlabel("prefix tokens recomputed in the step (dotted: ridge point)")
    ax.set_ylabel("step time (ms)")
    ax.set_title(f"eLLM recompute price, llama-2-13b, cost model ({hw.name})", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(Path(a.out_dir) / f"physics_{a.gpu}.png", dpi=100)
    plt.close(fig)
    for r in rows:
        if r["batch"] in (64, 192):
            print(r)
    print({k: v for k, v in payload.items() if k not in ("rows", "ellm_step_budget")})
    print("ellm step budget:", payload["ellm_step_budget"])


def step_budget_rows(engine, ctx: int) -> dict:
    """ellm's per-step recompute budget (adaptive mode) by batch: the engine's rule (the cost
    model's price when calibrated) beside the plain ridge rule."""
    from kvtier.policies.ellm.planner.step_budget import RidgeBudget, ridge_tokens

    opts, bs = engine.config.policy_options, engine.config.cache.block_size
    ridge = RidgeBudget(ridge_tokens(engine.executor.cost_model.hw), bs, opts.max_recompute_tokens)
    rule = opts.step_budget
    return {"rule": type(rule).__name__, "tolerance": opts.recompute_tolerance,
            "context": ctx, "cap": opts.max_recompute_tokens,
            "rows": [{"batch": b, "tokens": rule.tokens(b, ctx), "ridge_tokens": ridge.tokens(b, ctx)}
                     for b in (1, 8, 32, 64, 128, 160, 192, 256, 384, 512)]}


# ---- 5. planner perturbation -------------------------------------------------------------------
def exp_ablation(a: argparse.Namespace) -> None:
    """Swap with and without the layer-level overlap of its copies (`--no-overlap-swap`), on
    the e2e ShareGPT workload (1,000 requests) and on L-Eval, calibrated and at PCIe speed.
    Horizontal fusion has no ablation: the engine does not use it (measured slower on the
    H200, results/experiments/hfusion_h200.json), so every run here is already "without"."""
    os.environ.setdefault("KVTIER_ALLOW_LONG_MAX_MODEL_LEN", "1")
    cases = {
        "sharegpt": (sharegpt_workload(a, a.load_prompts, a.rate),
                     Slo(a.slo_ttft / 1e3, a.slo_tpot / 1e3), {}),
        "leval": (leval_workload(a), Slo(a.leval_slo_ttft / 1e3, a.leval_slo_tpot / 1e3),
                  dict(max_model_len=a.leval_max_len, max_num_seqs=a.leval_max_num_seqs)),
    }
    rows: dict = {}
    t0 = time.perf_counter()
    for wname, (w, slo, over) in cases.items():
        for overlap in (True, False):
            factory = sim_factory(a, VirtualClock(), a.gpu, overlap_swap=overlap, **over)
            results = run_experiment(w, factory, bench_config(a, ("swap", SWAP_PCIE), slo),
                                     log=lambda s: None)
            tag = "overlap" if overlap else "no_overlap"
            for r in results:
                rows[f"{wname}/{r.policy}/{tag}"] = headline(r)
    payload = {"gpu": a.gpu, "wall_s": time.perf_counter() - t0,
               "workloads": {k: workload_info(w) for k, (w, _, _) in cases.items()},
               "rows": rows,
               "fusion": "not used by the engine (slower than sequential launches on the H200)"}
    save(f"ablation_{a.gpu}", payload, a)
    _print_rows(f"ablation_{a.gpu}", rows)


def exp_planner(a: argparse.Namespace) -> None:
    from benchmarks import sim_ellm_sweeps

    sim_ellm_sweeps.main(["--workload", a.planner_workload, "--calibration", a.calibration,
                          "--out", "results/sim/sim_ellm_sweeps.json"])


EXPERIMENTS = {"physics": exp_physics, "e2e": exp_e2e, "load": exp_load, "leval": exp_leval,
               "fsweep": exp_fsweep, "planner": exp_planner, "ablation": exp_ablation}


def _csv(cast):
    return lambda s: tuple(cast(x) for x in s.split(",") if x.strip())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=[*EXPERIMENTS, "all"])
    ap.add_argument("--gpu", default="h200", help="h200 | a100-80gb (all: both for e2e)")
    ap.add_argument("--calibration", default=CALIBRATION)
    ap.add_argument("--workload", default=SHAREGPT)
    ap.add_argument("--num-prompts", type=int, default=3000)
    ap.add_argument("--rate", type=float, default=50.0)
    ap.add_argument("--kv-cache-gb", type=float, default=40.0)
    ap.add_argument("--swap-space", type=float, default=40.0)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=512,
                    help="seats: above what 40 GiB holds, so memory is the limit (the paper's "
                         "eLLM peaks at 448 running)")
    ap.add_argument("--slo-ttft", type=float, default=2000.0, help="ms")
    ap.add_argument("--slo-tpot", type=float, default=100.0, help="ms (also the planner's)")
    ap.add_argument("--policies", type=_csv(str), default=None,
                    help=f"default {','.join(POLICIES)}, and {SWAP_PCIE} on the H200 (swap with "
                         "its copies at PCIe speed; on the A100 profile they are already)")
    ap.add_argument("--ellm-recompute-budget", default="auto",
                    help="ellm's per-step recompute budget (EngineArgs): auto | ridge | cost | "
                         "max | a token count")
    ap.add_argument("--load-prompts", type=int, default=1000)
    ap.add_argument("--load-multiples", type=_csv(float), default=(0.1, 0.2, 0.3, 0.5, 1, 1.5, 2, 3))
    ap.add_argument("--leval-path", default=LEVAL)
    ap.add_argument("--leval-prompts", type=int, default=66)
    ap.add_argument("--leval-max-len", type=int, default=32768)
    ap.add_argument("--leval-max-num-seqs", type=int, default=64)
    ap.add_argument("--leval-rate", type=float, default=12.5,
                    help="the paper's L-Eval rate: the ShareGPT gaps x 4 (halved there, doubled here)")
    ap.add_argument("--leval-slo-ttft", type=float, default=10000.0)
    ap.add_argument("--leval-slo-tpot", type=float, default=200.0)
    ap.add_argument("--f-values", type=_csv(int), default=(2, 4, 8))
    ap.add_argument("--f-policies", type=_csv(str), default=("recompute", "ellm"))
    ap.add_argument("--planner-workload", default=".carry/sharegpt_llama2_13b_1500.json")
    ap.add_argument("--physics-ctx", type=int, default=400, help="decode context of the price table")
    ap.add_argument("--out-dir", default=str(OUT_DIR))
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    if a.policies is None:
        a.policies = POLICIES + ((SWAP_PCIE,) if a.gpu == "h200" else ())
    if a.experiment != "all":
        EXPERIMENTS[a.experiment](a)
        return
    for name, fn in EXPERIMENTS.items():
        t = time.perf_counter()
        fn(a)
        if name == "e2e" and a.gpu == "h200":
            fn(replace_ns(a, gpu="a100-80gb", policies=POLICIES))
        print(f"[{name}] {time.perf_counter() - t:.0f} s", flush=True)


def replace_ns(a: argparse.Namespace, **over) -> argparse.Namespace:
    return argparse.Namespace(**{**vars(a), **over})


if __name__ == "__main__":
    sys.exit(main())
