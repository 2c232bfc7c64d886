"""Automatic prefix caching on against off, a fresh engine each arm, in one process.

Parts (issue 25's targets), one per call:
  leval      L-Eval paper assistant, every instruction its own request (a paper's three in a
             row), Poisson at a fixed rate: per request TTFT with / without caching (the
             median ratio over the requests that hit), TTFT p50, ITL p90, throughput, the
             prefill tokens computed against the workload's unshared fraction.
  multiturn  ShareGPT conversations (a prepared `sharegpt-multiturn` file: each turn the
             conversation so far, closed loop with a think time): hit rate, TTFT p50/p90,
             throughput.
  offline    offline ShareGPT (no sharing): throughput on, off, on, off.

  python -m benchmarks.engine.bench_prefix_cache --part leval \
      --leval-path .carry/leval_paper_assistant.jsonl --out $OUT/engine/prefix_cache_leval_h200.json
  python -m benchmarks.engine.bench_prefix_cache --part multiturn \
      --workload .carry/sharegpt_multiturn_llama31_600.json --out $OUT/engine/prefix_cache_multiturn_h200.json
  python -m benchmarks.engine.bench_prefix_cache --part offline \
      --workload .carry/sharegpt_llama31_1000.json --out $OUT/engine/prefix_cache_offline_h200.json
  # the simulator's prediction of a serving part (CPU, virtual time):
  python -m benchmarks.engine.bench_prefix_cache --part leval --simulate \
      --calibration results/calibration/calib_h200_llama-3.1-8b.json \
      --leval-path ../shared/data/leval_paper_assistant.jsonl \
      --out results/engine/prefix_cache_leval_sim_h200.json
  python -m benchmarks.engine.plot_prefix_cache results/engine/prefix_cache_leval_sim_h200.json

The multi-turn file: `kvtier bench --model llama-3.1-8b --load-format dummy --workload
sharegpt-multiturn --num-prompts 600 --max-model-len 8192 --save-workload FILE --prepare-only`.
A request's cached tokens are where the scheduler started its first chunk (the plans are
read on their way to the executor); the measured run starts with an empty cache (the
warm-up's blocks are dropped).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from benchmarks.engine.plot_prefix_cache import plot
from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.experiment import BenchConfig, engine_backends, run_experiment
from kvtier.bench.metrics import Distribution
from kvtier.bench.request import BenchRequest, LengthLimits
from kvtier.bench.runner import RunOptions
from kvtier.bench.sharing import prefix_sharing
from kvtier.bench.synthetic import requests_with_lengths
from kvtier.bench.workload import Dataset, Workload, WorkloadSpec, build_workload
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import SamplingParams

ARMS = ("off", "on")  # caching off first: its cache-less figures are the baseline
HIT_FRACTION = 0.5  # a request "hits" when at least this much of its prompt was cached


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=("leval", "multiturn", "offline"), required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--device", default=None, help="default: the engine's (cuda where present)")
    p.add_argument("--leval-path", default=None)
    p.add_argument("--workload", default=None, help="prepared JSON (multiturn, offline)")
    p.add_argument("--num-prompts", type=int, default=None,
                   help="default: every L-Eval instruction; 600 turns; 1,000 offline")
    p.add_argument("--rate", type=float, default=None,
                   help="Poisson arrivals: requests/s (leval, default 1), conversations/s "
                        "(multiturn, default 4)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default 32768 (leval), 8192 (multiturn), 4096 (offline)")
    p.add_argument("--max-num-batched-tokens", type=int, default=None)
    p.add_argument("--leval-max-document-tokens", type=int, default=None)
    p.add_argument("--max-duration", type=float, default=None, help="per arm, seconds")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--simulate", action="store_true",
                   help="leval, multiturn: the simulator (virtual time) instead of the GPU")
    p.add_argument("--calibration", default=None, help="simulator: cost-model calibration JSON")
    return p.parse_args(argv)


# ---- the engine of each arm, and what it cached ------------------------------------------
class PlanTap:
    """The executor, seen through: records where each request's first chunk started (the
    prefix the scheduler admitted it with from the cache)."""

    def __init__(self, inner: Any, cached: dict[str, int]):
        self.inner, self.cached = inner, cached

    def _seen(self, plan) -> None:
        for sr in plan.scheduled:
            self.cached.setdefault(sr.request_id, sr.start_pos)

    def execute(self, plan):
        self._seen(plan)
        return self.inner.execute(plan)

    def launch(self, plan):
        self._seen(plan)
        return self.inner.launch(plan)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


@dataclass(frozen=True)
class SimSetting:
    calibration: str | None
    clock: Any  # the VirtualClock the engines and the runner share


class Arms:
    """Builds each arm's engine (warmed up on prompts of its own, its cache then emptied)
    and keeps what it cached per request and its cache's counters."""

    def __init__(self, engine_args: EngineArgs, vocab_size: int,
                 simulate: SimSetting | None = None):
        self.engine_args, self.vocab_size, self.simulate = engine_args, vocab_size, simulate
        self.cached: dict[str, dict[str, int]] = {arm: {} for arm in ARMS}
        self.cache_stats: dict[str, Any] = {}  # arm -> (its PrefixCache, counters after warm-up)

    def engine(self, arm: str) -> LLMEngine:
        engine_args = replace(self.engine_args, enable_prefix_caching=arm == "on")
        if self.simulate is not None:
            from kvtier.sim import build_sim_engine

            engine = build_sim_engine(engine_args, "h200", self.simulate.calibration,
                                      clock=self.simulate.clock)
        else:
            engine = LLMEngine.from_engine_args(engine_args)
        long = min(2048, engine.config.scheduler.max_model_len - 16)
        warm = requests_with_lengths([(long, 8), (100, 8)], self.vocab_size, seed=12345)
        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)
        for i, r in enumerate(warm):
            engine.add_request(f"warm-{i}", list(r.prompt_token_ids), params)
        while engine.has_unfinished_requests():
            engine.step()
        engine.scheduler.kv.reset_prefix_cache()  # the run starts from an empty cache
        engine.executor = PlanTap(engine.executor, self.cached[arm])
        cache = engine.scheduler.kv.prefix_cache
        if cache is not None:  # read after the run, less what the warm-up counted
            self.cache_stats[arm] = (cache, replace(cache.stats))
        return engine

    def cache_counters(self, arm: str) -> dict[str, Any] | None:
        if arm not in self.cache_stats:
            return None
        cache, before = self.cache_stats[arm]
        now = cache.stats
        queries, hits = now.queries - before.queries, now.hits - before.hits
        return {"queries": queries, "hits": hits, "hit_rate": hits / queries if queries else 0.0,
                "preempted_queries": now.preempted_queries - before.preempted_queries,
                "preempted_hits": now.preempted_hits - before.preempted_hits,
                "evicted_blocks": now.evicted_blocks - before.evicted_blocks}

    def cached_tokens(self, arm: str, n: int) -> list[int]:
        return [self.cached[arm].get(f"{arm}-{i}", 0) for i in range(n)]


def _ms(d: Distribution | None, key: str) -> float | None:
    return None if d is None else 1e3 * getattr(d, key)


def run_arms(arms: Arms, workload: Workload, max_duration: float | None) -> dict[str, Any]:
    config = BenchConfig(policies=ARMS, warmup_requests=0, monitor_gpu=False,
                         run=RunOptions(progress=False, max_duration_s=max_duration))
    clock = arms.simulate.clock if arms.simulate is not None else None
    results = run_experiment(workload, engine_backends(arms.engine, clock=clock), config,
                             log=lambda line: print(line, flush=True))
    n, prompts = len(workload.requests), [r.prompt_len for r in workload.requests]
    out: dict[str, Any] = {}
    for res in results:
        s, cached = res.summary, arms.cached_tokens(res.policy, n)
        computed = res.engine.get("num_prompt_tokens") or 0
        out[res.policy] = {
            "ttft_ms": {k: _ms(s.ttft_s, k) for k in ("p50", "p90", "p99", "mean")},
            "itl_ms": {k: _ms(s.itl_s, k) for k in ("p50", "p90", "p99")},
            "tpot_ms": {k: _ms(s.tpot_s, k) for k in ("p50", "p90")},
            "output_throughput": s.output_throughput,
            "total_token_throughput": s.total_token_throughput,
            "request_throughput": s.request_throughput,
            "num_completed": s.num_completed, "num_requests": s.num_requests,
            "duration_s": s.duration_s,
            "prompt_tokens_computed": computed,
            "prompt_tokens_computed_fraction": computed / sum(prompts),
            "recomputed_tokens": res.engine.get("num_recomputed_tokens"),
            "num_preemptions": res.engine.get("num_preemptions"),
            "cached_tokens": sum(cached),
            "hit_rate": sum(cached) / sum(prompts),
            "prefix_cache_stats": arms.cache_counters(res.policy),
            "per_request": {"ttft_ms": [None if r.ttft_s is None else 1e3 * r.ttft_s
                                        for r in res.run.records],
                            "cached_tokens": cached, "prompt_len": prompts},
        }
    out["comparison"] = compare(out["off"], out["on"])
    return out


def compare(off: dict[str, Any], on: dict[str, Any]) -> dict[str, Any]:
    """Per request TTFT ratios (off / on) over the requests whose prompt was mostly cached,
    and the ratios of the arms' figures."""
    t_off, t_on = off["per_request"]["ttft_ms"], on["per_request"]["ttft_ms"]
    cached, prompts = on["per_request"]["cached_tokens"], on["per_request"]["prompt_len"]
    ratios = [a / b for a, b, c, p in zip(t_off, t_on, cached, prompts)
              if a is not None and b and c >= HIT_FRACTION * p]
    any_hit = [a / b for a, b, c in zip(t_off, t_on, cached) if a is not None and b and c]

    def ratio(key: str, pct: str) -> float | None:
        a, b = off[key][pct], on[key][pct]
        return a / b if a is not None and b else None

    return {
        "hit_definition": f"cached tokens >= {HIT_FRACTION:g} x prompt",
        "num_hit_requests": len(ratios),
        "hit_ttft_ratio_median": statistics.median(ratios) if ratios else None,
        "hit_ttft_ratio_min": min(ratios) if ratios else None,
        "any_hit_ttft_ratio_median": statistics.median(any_hit) if any_hit else None,
        "ttft_p50_ratio": ratio("ttft_ms", "p50"), "ttft_p90_ratio": ratio("ttft_ms", "p90"),
        "itl_p90_ratio": ratio("itl_ms", "p90"),
        "output_throughput_ratio": on["output_throughput"] / off["output_throughput"]
        if off["output_throughput"] else None,
    }


# ---- the parts ---------------------------------------------------------------------------
def _engine_args(args: argparse.Namespace, max_model_len: int) -> EngineArgs:
    extra = {"device": args.device} if args.device else {}
    if args.max_num_batched_tokens:
        extra["max_num_batched_tokens"] = args.max_num_batched_tokens
    return EngineArgs(model=args.model, load_format="dummy", max_model_len=max_model_len,
                      kv_policy="recompute", **extra)


def _tokenizer_and_vocab(engine_args: EngineArgs):
    from kvtier.bench.cli import _tokenizer_and_config

    tok, config = _tokenizer_and_config(engine_args)
    return tok, config.model_config.vocab_size


def part_serving(args: argparse.Namespace) -> dict[str, Any]:
    leval = args.part == "leval"
    max_len = args.max_model_len or (32768 if leval else 8192)
    engine_args = _engine_args(args, max_len)
    tok, vocab = _tokenizer_and_vocab(engine_args)
    rate = args.rate or (1.0 if leval else 4.0)
    limits = LengthLimits(max_prompt_len=max_len - 1, max_total_len=max_len)
    spec = WorkloadSpec(
        dataset=Dataset.LEVAL if leval else Dataset.PREPARED,
        num_requests=args.num_prompts or 0, arrivals=ArrivalSpec(ArrivalKind.POISSON, rate=rate),
        seed=args.seed, path=args.leval_path if leval else args.workload, limits=limits,
        max_document_tokens=args.leval_max_document_tokens)
    if leval and not args.num_prompts:  # every instruction of every paper
        spec = replace(spec, num_requests=_all_leval(spec, tok))
    if not leval and not args.num_prompts:
        spec = replace(spec, num_requests=600)
    workload = build_workload(spec, tok, vocab)
    sharing = prefix_sharing(workload.requests, engine_args.block_size)
    print(f"workload: {workload.summary()}\nsharing: {sharing.to_dict()}", flush=True)
    sim = None
    if args.simulate:
        from kvtier.sim import VirtualClock

        sim = SimSetting(args.calibration, VirtualClock())
    arms = run_arms(Arms(engine_args, vocab, sim), workload, args.max_duration)
    return {"part": args.part, "rate": rate,
            "mode": f"simulated h200 ({args.calibration or 'roofline'})" if sim else "gpu", "rate_unit": "requests/s" if leval else
            "conversations/s", "engine": _engine_record(engine_args),
            "workload": {**workload.spec.to_dict(), **workload.summary()},
            "sharing": sharing.to_dict(), **arms}


def _all_leval(spec: WorkloadSpec, tok) -> int:
    from kvtier.bench.leval import load_leval, sample_leval

    assert spec.path is not None
    return len(sample_leval(load_leval(spec.path), tok, None, 0, spec.effective_limits,
                            spec.max_document_tokens))


def _engine_record(engine_args: EngineArgs) -> dict[str, Any]:
    config = engine_args.create_engine_config()
    return {"model": engine_args.model, "load_format": engine_args.load_format,
            "max_model_len": config.scheduler.max_model_len,
            "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
            "max_num_seqs": config.scheduler.max_num_seqs, "kv_policy": engine_args.kv_policy,
            "block_size": engine_args.block_size,
            "prefix_caching_hash_algo": engine_args.prefix_caching_hash_algo}


def _free_gpu() -> None:
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def offline_run(args: argparse.Namespace, rows: list, enable: bool) -> dict[str, Any]:
    """One offline run (bench_offline_throughput's engine settings) on a fresh engine."""
    from kvtier import LLM

    extra = {"device": args.device} if args.device else {}
    llm = LLM(args.model, load_format="dummy", max_model_len=args.max_model_len or 4096,
              layers_per_block=4, swap_space=1, gpu_memory_utilization=0.9,
              enable_prefix_caching=enable, **extra)
    engine = llm.engine
    params = dict(temperature=0.0, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": rows[0][0]}], [SamplingParams(max_tokens=8, **params)])
    engine.scheduler.kv.reset_prefix_cache()  # the warm-up's prompt is the first request's
    for i, (prompt, out) in enumerate(rows):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=out, output_kind="final_only",
                                                          **params))
    n_out, num_steps = 0, 0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        n_out += sum(len(o.outputs[0].token_ids) for o in engine.step() if o.finished)
        num_steps += 1
    elapsed = time.perf_counter() - t0
    assert n_out == sum(out for _, out in rows), "every request must produce its full output"
    cache = engine.scheduler.kv.prefix_cache
    stats = engine.get_stats()
    engine.close()
    del llm, engine
    _free_gpu()
    return {"prefix_caching": enable, "elapsed_s": elapsed, "output_tokens_per_s": n_out / elapsed,
            "total_tokens_per_s": (n_out + sum(len(p) for p, _ in rows)) / elapsed,
            "num_steps": num_steps, "mean_step_ms": 1e3 * elapsed / num_steps,
            "num_preemptions": stats.num_preemptions_total,
            "cache_hit_tokens": cache.stats.hits if cache is not None else None}


def part_offline(args: argparse.Namespace) -> dict[str, Any]:
    work = json.loads(Path(args.workload).read_text())
    rows = work["requests"][: args.num_prompts or 1000]
    reqs = [BenchRequest(tuple(p), o) for p, o in rows]
    runs = []
    for enable in (True, False, True, False):  # alternated: drifts of the GPU hit both arms
        runs.append(offline_run(args, rows, enable))
        print(f"offline, caching {'on' if enable else 'off'}: "
              f"{runs[-1]['output_tokens_per_s']:.0f} output tok/s", flush=True)
    on = [r["output_tokens_per_s"] for r in runs if r["prefix_caching"]]
    off = [r["output_tokens_per_s"] for r in runs if not r["prefix_caching"]]
    return {"part": "offline", "model": args.model, "num_requests": len(rows),
            "workload": {k: v for k, v in work.items() if k != "requests"},
            "sharing": prefix_sharing(reqs, 16).to_dict(), "runs": runs,
            "output_tokens_per_s_on_mean": statistics.fmean(on),
            "output_tokens_per_s_off_mean": statistics.fmean(off),
            "on_over_off": statistics.fmean(on) / statistics.fmean(off),
            "target": "on within 1 % of off"}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.simulate and args.part == "offline":
        raise SystemExit("bench_prefix_cache: the offline part runs on the GPU only")
    result = part_offline(args) if args.part == "offline" else part_serving(args)
    if "comparison" in result:
        print(json.dumps(result["comparison"], indent=1))
    write_result(args.out, result)
    try:
        print(plot(args.out))
    except ImportError:  # no matplotlib on the device: plot here later
        print("matplotlib absent: python -m benchmarks.engine.plot_prefix_cache RESULT.json")


if __name__ == "__main__":
    main()
