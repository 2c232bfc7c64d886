"""Strata's host tier against the GPU prefix cache alone, on a workload whose prefix working
set outgrows a capped device KV pool: TTFT p50/p90, throughput (and at a TTFT SLO) and the
host tier's counters, for each variant, one engine after another on the same requests:

  a  gpu        the device prefix cache only (evicted prefixes are recomputed)
  b  direct     + host tier, io-backend direct (copy engine, one copy per run of blocks)
  c  kernel     + host tier, io-backend kernel (Triton, through the pages' UVA address)
  d  kernel+cas (c) + cache-aware admission (delayed hits, --hicache-loading-bound,
                bubble filling by prefetch)
Ratios are to (a). Every `kvtier bench` option works (workload, arrivals, engine flags), so
the workload is named like `kvtier bench --workload` names it. Sweeps (each adds runs under
labels of their own; (a) runs once):

  --write-policies write_through,write_back   (b)-(d) once per --hicache-write-policy,
                                               labelled c/write_back, ...
  --loading-bounds 0,1,2,4,8                   (d) once per --hicache-loading-bound,
                                               labelled d/lb=2, ... (0: no bound)
  --load-programs 2,8                          (c) and (d) once per --hicache-load-programs
                                               (the kernel's programs for a hit's loads),
                                               labelled c/lp=8, ...
  --schedule-policies fcfs,lpm                 every variant, (a) too, once per
                                               --schedule-policy (the waiting queue's
                                               order), labelled a/sp=lpm, ...; ratios to
                                               the (a) of the same policy
  --goodput-sweep --sweep-rates 1,2,3          each run also finds its throughput at the
                                               SLO (--slo-ttft): the highest rate that keeps
                                               --goodput-target of requests inside it

  python -m benchmarks.policies.bench_strata --model llama-3.1-8b --load-format dummy \\
      --workload leval --dataset-path .carry/leval_paper_assistant.jsonl --num-prompts 200 \\
      --arrivals poisson --rate 1 --kv-cache-gb 6 --host-gib 64 --slo-ttft 2000 \\
      --out results/policies/strata_leval_h200.json                  (H200, minutes)
  python -m benchmarks.policies.bench_strata --model tiny-llama --load-format dummy \\
      --device cpu --workload synthetic --num-prompts 8 --input-len 96 --output-len 32 \\
      --num-gpu-blocks 96 --host-gib 0.01 \\
      --max-model-len 256 --out /tmp/strata_smoke.json              (CPU smoke run)
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.common import write_result
from kvtier.bench.cli import add_bench_args, bench_config, workload_spec
from kvtier.bench.experiment import engine_backends, run_once, sweep_goodput
from kvtier.bench.metrics import summarize_run
from kvtier.bench.workload import build_workload
from kvtier.config import SCHEDULE_POLICIES
from kvtier.engine.args import EngineArgs
from kvtier.kv.host_tier import WritePolicy
from kvtier.offload.args import HostTierArgs

VARIANTS = {"a": "gpu", "b": "direct", "c": "kernel", "d": "kernel+cas"}


@dataclass(frozen=True)
class Run:
    label: str  # the variant, then what a sweep set: "c/write_back", "d/lb=2"
    variant: str
    write_policy: str | None = None  # None: the run's own --hicache-write-policy
    loading_bound: float | None = None  # None: the run's own --hicache-loading-bound
    load_programs: int | None = None  # None: the run's own --hicache-load-programs
    schedule_policy: str | None = None  # None: the run's own --schedule-policy


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_bench_args(p)
    EngineArgs.add_cli_args(p, positional_model=False)
    p.add_argument("--variants", default="a,b,c,d", help="which of a,b,c,d, in this order")
    p.add_argument("--host-gib", type=float, default=64.0, help="host tier size (b-d)")
    p.add_argument("--write-policies", type=_choices([w.value for w in WritePolicy],
                                                     "write policies"),
                   help="run b-d once per write policy, a comma list of "
                        f"{', '.join(w.value for w in WritePolicy)}")
    p.add_argument("--loading-bounds", type=_bounds,
                   help="run d once per --hicache-loading-bound, a comma list (0: no bound)")
    p.add_argument("--load-programs", type=_counts,
                   help="run c and d once per --hicache-load-programs, a comma list")
    p.add_argument("--schedule-policies", type=_choices(list(SCHEDULE_POLICIES),
                                                        "schedule policies"),
                   help="run every variant once per --schedule-policy, a comma list of "
                        f"{', '.join(SCHEDULE_POLICIES)}")
    return p.parse_args(argv)


def _choices(known: list[str], what: str):
    """An argparse type: a comma list of some of `known`."""
    def parse(text: str) -> list[str]:
        names = [n.strip() for n in text.split(",") if n.strip()]
        bad = [n for n in names if n not in known]
        if bad or not names:
            raise argparse.ArgumentTypeError(f"unknown {what} {bad}, give some of {known}")
        return names
    return parse


def _numbers(text: str, kind: type, what: str, least: float) -> list:
    """A comma list of numbers of `kind`, each >= least (argparse's error otherwise)."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"{what} are numbers: {e}") from None
    if not values or min(values) < least:
        raise argparse.ArgumentTypeError(f"{what} are >= {least}, got {text!r}")
    return values


def _bounds(text: str) -> list[float]:
    return _numbers(text, float, "loading bounds", 0)


def _counts(text: str) -> list[int]:
    return _numbers(text, int, "program counts", 1)


def plan_runs(variants: str, write_policies: list[str] | None = None,
              loading_bounds: list[float] | None = None,
              load_programs: list[int] | None = None,
              schedule_policies: list[str] | None = None) -> list[Run]:
    """The runs in order: each variant of `variants` once, or once per write policy (b-d),
    per loading bound (d), per load program count (c, d) and per schedule policy (all),
    every combination of those given."""
    names = [v.strip() for v in variants.split(",") if v.strip()]
    for name in names:
        if name not in VARIANTS:
            raise SystemExit(f"bench_strata: unknown variant {name!r}, one of {sorted(VARIANTS)}")
    if loading_bounds and "d" not in names:
        raise SystemExit("bench_strata: --loading-bounds sweeps variant d: add d to --variants")
    if load_programs and not {"c", "d"} & set(names):
        raise SystemExit("bench_strata: --load-programs sweeps variants c and d: add one")
    runs = []
    for name in names:
        policies: list[str | None] = [None]
        bounds: list[float | None] = [None]
        programs: list[int | None] = [None]
        if write_policies and name != "a":  # (a) has no host tier to write to
            policies = list(write_policies)
        if loading_bounds and name == "d":
            bounds = list(loading_bounds)
        if load_programs and name in ("c", "d"):
            programs = list(load_programs)
        orders: list[str | None] = list(schedule_policies) if schedule_policies else [None]
        for wp, lb, lp, sp in itertools.product(policies, bounds, programs, orders):
            label = "/".join([name, *([wp] if wp else []),
                              *([f"lb={lb:g}"] if lb is not None else []),
                              *([f"lp={lp}"] if lp is not None else []),
                              *([f"sp={sp}"] if sp is not None else [])])
            runs.append(Run(label, name, wp, lb, lp, sp))
    return runs


def variant_args(name: str, base: HostTierArgs, host_gib: float) -> HostTierArgs:
    """The host tier flags of one variant; the write policy and layout are the run's own."""
    if name == "a":
        return HostTierArgs()
    on = replace(base, kv_offloading_size=host_gib, hicache_ratio=None,
                 hicache_io_backend="direct" if name == "b" else "kernel",
                 hicache_mem_layout=None, hicache_delayed_hits=name == "d",
                 hicache_prefetch=name == "d",
                 hicache_loading_bound=base.hicache_loading_bound if name == "d" else 0.0)
    return on


def run_host_args(run: Run, base: HostTierArgs, host_gib: float) -> HostTierArgs:
    """The host tier flags of one run: its variant's, with what its sweep sets."""
    if run.write_policy is not None:
        base = replace(base, hicache_write_policy=run.write_policy)
    if run.loading_bound is not None:
        base = replace(base, hicache_loading_bound=run.loading_bound)
    if run.load_programs is not None:
        base = replace(base, hicache_load_programs=run.load_programs)
    return variant_args(run.variant, base, host_gib)


def run_variant(engine_args: EngineArgs, workload: Any, config: Any, simulate: bool,
                args: argparse.Namespace, name: str = "") -> dict[str, Any]:
    from kvtier.engine.llm_engine import LLMEngine

    if simulate:
        from kvtier.sim import VirtualClock, build_sim_engine

        clock = VirtualClock()
        factory = engine_backends(lambda _: build_sim_engine(
            engine_args, args.gpu, args.calibration, clock=clock), args.ignore_eos, clock)
    else:
        factory = engine_backends(lambda _: LLMEngine.from_engine_args(engine_args),
                                  args.ignore_eos)
    result = run_once(factory, engine_args.kv_policy, workload, config, monitor=None)
    # Throughput at the SLO (--goodput-sweep): the highest rate a variant keeps the target
    # share of requests inside it, each probe the same requests at another rate.
    # Its probes log as "<kv policy> @ rate": say which variant they belong to.
    goodput = (sweep_goodput(factory, engine_args.kv_policy, workload, config,
                             lambda m: print(f"{name}{m}", file=sys.stderr)).to_dict()
               if config.sweep is not None else None)
    summary = summarize_run(result, config.slo).to_dict()
    last = result.steps[-1].stats if result.steps else None
    tier = last.host_tier if last is not None else None
    return {"summary": summary, "duration_s": result.duration_s, "goodput": goodput,
            "host_tier": tier.to_dict() if tier is not None else None,
            "load_stall_fraction": (tier.load_stall_seconds / result.duration_s
                                    if tier is not None and result.duration_s else None),
            "flags": vars(engine_args.host_tier), "schedule_policy": engine_args.schedule_policy}


def ratios(results: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """(a)'s TTFT p50/p90 over each variant's (how many times lower), and each variant's
    throughput and throughput at the SLO (goodput, when swept) over (a)'s: the (a) of the
    same schedule policy where the policies were swept."""
    out = {}
    for name, r in results.items():
        order = next((part for part in name.split("/") if part.startswith("sp=")), None)
        base = results.get(f"a/{order}" if order else "a")
        if base is None:
            continue
        row: dict[str, float | None] = {}
        for q in ("p50", "p90"):
            a, x = _ttft(base, q), _ttft(r, q)
            row[f"ttft_{q}_lower_x"] = a / x if a and x else None
        a_t, x_t = base["summary"]["request_throughput"], r["summary"]["request_throughput"]
        row["throughput_x"] = x_t / a_t if a_t else None
        a_g, x_g = _goodput(base), _goodput(r)
        row["goodput_x"] = x_g / a_g if a_g and x_g else None
        out[name] = row
    return out


def _goodput(result: dict) -> float | None:
    return result["goodput"]["goodput_rate"] if result.get("goodput") else None


def _ttft(result: dict, q: str) -> float | None:
    ttft = result["summary"].get("ttft_s")
    return ttft.get(q) if ttft else None


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = plan_runs(args.variants, args.write_policies, args.loading_bounds,
                     args.load_programs, args.schedule_policies)  # before any work
    base = EngineArgs.from_cli_args(args)
    config = bench_config(args)
    tokenizer_config = base.create_engine_config()
    from kvtier.bench.cli import _tokenizer_and_config

    tokenizer, _ = _tokenizer_and_config(base)
    spec = workload_spec(args, tokenizer_config.scheduler.max_model_len)
    workload = build_workload(spec, tokenizer, tokenizer_config.model_config.vocab_size)
    results: dict[str, dict] = {}
    for run in runs:
        engine_args = replace(base, host_tier=run_host_args(run, base.host_tier, args.host_gib),
                              schedule_policy=run.schedule_policy or base.schedule_policy)
        name = run.label
        results[name] = {"label": VARIANTS[run.variant],
                         **run_variant(engine_args, workload, config, args.simulate, args,
                                       f"{name} ")}
        s = results[name]["summary"]
        print(f"{name} {VARIANTS[run.variant]:>10}: TTFT p50 {_ttft(results[name], 'p50')} s, "
              f"{s['request_throughput']:.3f} req/s", file=sys.stderr)
    payload = {"workload": spec.to_dict(), "workload_summary": workload.summary(),
               "variants": results, "ratios_to_a": ratios(results),
               "simulated": bool(args.simulate)}
    write_result(args.out or "strata_bench.json", payload)


if __name__ == "__main__":
    main()
