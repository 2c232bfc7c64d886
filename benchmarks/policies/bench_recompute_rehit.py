"""Preempt-recompute with the prefix cache (issue 25): a preempted request's blocks stay cached,
so its re-admission takes them back instead of prefilling them again. How much does that
alone change the recompute baseline? ShareGPT, where requests share no prefix (every hit is a
request's own KV after its preemption), under memory pressure: the recompute policy with
caching off and on, one after the other in one call — prefill tokens computed again after
preemption, preemptions, throughput, TTFT and TPOT.

  simulator (CPU):  python -m benchmarks.policies.bench_recompute_rehit --simulate \\
      --calibration results/calibration/calib_h200_llama-3.1-8b.json \\
      --workload .carry/sharegpt_llama31_1000.json --out results/policies/recompute_rehit_sim_h200.json
  real engine (GPU): python -m benchmarks.policies.bench_recompute_rehit \\
      --workload .carry/sharegpt_llama31_1000.json --out results/policies/recompute_rehit_h200.json

"Computed again" counts every token the engine scheduled beyond what the run needs once
(each request's prompt and outputs but its last, less the tokens its first admission hit):
the prefill work preemption costs, whatever the cache saves of it.
"""

from __future__ import annotations

import argparse
import dataclasses

from benchmarks.common import write_result
from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import summarize_run
from kvtier.bench.prepared import load_prepared
from kvtier.bench.request import LengthLimits
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.bench.workload import with_arrivals
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine


def _count_scheduled_tokens(engine: LLMEngine) -> list[int]:
    """A one-item list that sums the tokens of every plan the scheduler makes from now on."""
    total = [0]
    schedule = engine.scheduler.schedule

    def counted():
        plan = schedule()
        total[0] += sum(len(sr.token_ids) for sr in plan.scheduled)
        return plan

    engine.scheduler.schedule = counted  # type: ignore[method-assign]
    return total


def _build(args: argparse.Namespace, engine_args: EngineArgs):
    if not args.simulate:
        return LLMEngine.from_engine_args(engine_args), None
    from kvtier.sim import VirtualClock, build_sim_engine

    clock = VirtualClock()
    return build_sim_engine(engine_args, "h200", args.calibration, clock=clock), clock


def run(args: argparse.Namespace, engine_args: EngineArgs, requests) -> dict:
    engine, clock = _build(args, engine_args)
    scheduled = _count_scheduled_tokens(engine)
    backend = EngineBackend(engine, ignore_eos=True, clock=clock)
    result = run_workload(backend, requests, RunOptions(progress=False), clock=clock)
    s, stats, c = summarize_run(result), engine.get_stats(), engine.scheduler.counters
    pc = engine.kv_manager.prefix_cache
    first_hits = pc.stats.hits if pc is not None else 0
    needed_once = sum(r.prompt_len + r.output_len - 1 for r in requests) - first_hits
    out = {"enable_prefix_caching": engine_args.enable_prefix_caching,
           "num_completed": s.num_completed, "output_tok_s": s.output_throughput,
           "total_tok_s": s.total_token_throughput, "duration_s": s.duration_s,
           "ttft_p50_s": s.ttft_s.p50 if s.ttft_s else None,
           "ttft_p90_s": s.ttft_s.p90 if s.ttft_s else None,
           "tpot_p50_s": s.tpot_s.p50 if s.tpot_s else None,
           "tpot_p90_s": s.tpot_s.p90 if s.tpot_s else None,
           "preemptions": stats.num_preemptions_total,
           "kv_dropped_tokens": c.num_recomputed_tokens,  # KV freed by preemption
           "tokens_scheduled": scheduled[0], "tokens_needed_once": needed_once,
           "tokens_computed_again": scheduled[0] - needed_once,
           "readmission_hit_tokens": pc.stats.preempted_hits if pc is not None else 0,
           "first_admission_hit_tokens": first_hits,
           "evicted_blocks": pc.stats.evicted_blocks if pc is not None else 0}
    engine.close()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", required=True, help="a prepared ShareGPT trace (.carry/)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=None,
                    help="Poisson requests/s (default: offline, every request at once)")
    ap.add_argument("--kv-cache-gb", type=float, default=4.0,
                    help="a KV pool small enough that requests are preempted")
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--simulate", action="store_true", help="the simulator (CPU), not the GPU")
    ap.add_argument("--calibration", default=None, help="the simulator's calibration")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    arrivals = (ArrivalSpec(ArrivalKind.OFFLINE) if args.rate is None
                else ArrivalSpec(ArrivalKind.POISSON, rate=args.rate))
    requests = with_arrivals(load_prepared(args.workload, args.num_prompts, LengthLimits()),
                             arrivals, seed=0)
    base = EngineArgs(model=args.model, load_format="dummy", kv_policy="recompute",
                      kv_cache_gb=args.kv_cache_gb, max_num_seqs=args.max_num_seqs,
                      max_model_len=4096)
    runs = []
    for cache in (False, True):
        runs.append(run(args, dataclasses.replace(base, enable_prefix_caching=cache), requests))
        print(runs[-1], flush=True)
    off, on = runs
    write_result(args.out, {
        "question": "preempt-recompute with caching off vs on (re-admission re-hits), "
                    "ShareGPT (no sharing), memory pressure",
        "simulated": args.simulate, "calibration": args.calibration, "model": args.model,
        "workload": args.workload, "num_prompts": len(requests), "rate": args.rate,
        "kv_cache_gb": args.kv_cache_gb, "max_num_seqs": args.max_num_seqs, "runs": runs,
        "tokens_computed_again_ratio": (on["tokens_computed_again"]
                                        / max(1, off["tokens_computed_again"])),
        "output_tok_s_ratio": on["output_tok_s"] / off["output_tok_s"]})


if __name__ == "__main__":
    main()
