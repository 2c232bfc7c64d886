"""Inter-token latency under long prompts, per --long-prefill-token-threshold.

Long documents (L-Eval paper assistant, 8K-23K tokens) arrive at a fixed rate; each step
that carries a long prompt's chunk delays every running decode by that chunk's time. The
sweep runs the same workload on a fresh engine per threshold (0: no cap) and records ITL,
TPOT and TTFT percentiles and throughput for each, and which threshold is the largest (the
cheapest in TTFT) whose ITL p90 meets the TPOT SLO.

  python -m benchmarks.serving.bench_long_prefill_itl --leval-path data/leval_paper_assistant.jsonl \
      --out results/serving/long_prefill_itl_h200.json
  # the same in the simulator (CPU, virtual time):
  python -m benchmarks.serving.bench_long_prefill_itl --simulate \
      --calibration results/calibration/calib_h200_llama-3.1-8b.json ...
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

from benchmarks.common import write_result
from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.experiment import BenchConfig, engine_backends, run_experiment
from kvtier.bench.metrics import Distribution, Slo
from kvtier.bench.request import LengthLimits
from kvtier.bench.runner import RunOptions
from kvtier.bench.workload import Dataset, Workload, WorkloadSpec, build_workload
from kvtier.engine.args import EngineArgs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--leval-path", required=True, help="L-Eval JSONL (paper assistant)")
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--load-format", default="dummy")
    p.add_argument("--max-model-len", type=int, default=32768)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-num-partial-prefills", type=int, default=1)
    p.add_argument("--thresholds", default="0,4096,2048,1024,512",
                   help="comma-separated --long-prefill-token-threshold values (0: no cap)")
    p.add_argument("--num-prompts", type=int, default=24)
    p.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals, requests/s")
    p.add_argument("--seed", type=int, default=0, help="workload seed (sampling and arrivals)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0,
                   help="the TPOT SLO the ITL p90 must meet")
    p.add_argument("--max-duration", type=float, default=None,
                   help="abort a run's remaining requests after this many seconds")
    p.add_argument("--warmup-requests", type=int, default=1)
    p.add_argument("--simulate", action="store_true", help="the simulator (virtual time)")
    p.add_argument("--gpu", default="h200", help="simulated GPU")
    p.add_argument("--calibration", default=None, help="simulator: cost-model calibration JSON")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def leval_workload(args: argparse.Namespace, engine_args: EngineArgs) -> Workload:
    from kvtier.bench.cli import _tokenizer_and_config

    tokenizer, config = _tokenizer_and_config(engine_args)
    max_len = config.scheduler.max_model_len
    spec = WorkloadSpec(
        dataset=Dataset.LEVAL, num_requests=args.num_prompts, path=args.leval_path,
        arrivals=ArrivalSpec(ArrivalKind.POISSON, rate=args.rate), seed=args.seed,
        limits=LengthLimits(max_prompt_len=max_len - 1, max_total_len=max_len))
    return build_workload(spec, tokenizer, config.model_config.vocab_size)


def backend_factory(args: argparse.Namespace, engine_args: EngineArgs):
    if args.simulate:
        from kvtier.sim import VirtualClock, build_sim_engine

        clock = VirtualClock()
        return engine_backends(lambda policy: build_sim_engine(
            replace(engine_args, kv_policy=policy), args.gpu, args.calibration, clock=clock),
            ignore_eos=True, clock=clock)
    from kvtier.engine.llm_engine import LLMEngine

    return engine_backends(lambda policy: LLMEngine.from_engine_args(
        replace(engine_args, kv_policy=policy)), ignore_eos=True)


def _ms(d: Distribution | None, key: str) -> float | None:
    return None if d is None else 1e3 * getattr(d, key)


def run_setting(args: argparse.Namespace, engine_args: EngineArgs, workload: Workload,
                threshold: int) -> dict[str, Any]:
    setting = replace(engine_args, long_prefill_token_threshold=threshold)
    config = BenchConfig(policies=("recompute",), slo=Slo(tpot_s=args.slo_tpot_ms / 1e3),
                         warmup_requests=args.warmup_requests,
                         run=RunOptions(progress=False, max_duration_s=args.max_duration),
                         monitor_gpu=False)
    (result,) = run_experiment(workload, backend_factory(args, setting), config,
                               log=lambda line: print(f"threshold {threshold}: {line}"))
    s = result.summary
    row = {
        "long_prefill_token_threshold": threshold,
        # vLLM's rule: several partial prefills and no threshold cap at 4 % of max_model_len.
        "effective_long_prefill_token_threshold":
            setting.create_engine_config().scheduler.effective_long_prefill_threshold,
        "max_num_partial_prefills": args.max_num_partial_prefills,
        "itl_ms": {k: _ms(s.itl_s, k) for k in ("p50", "p90", "p99", "max")},
        "tpot_ms": {k: _ms(s.tpot_s, k) for k in ("p50", "p90")},
        "ttft_ms": {k: _ms(s.ttft_s, k) for k in ("p50", "p90", "max")},
        "output_throughput": s.output_throughput,
        "total_token_throughput": s.total_token_throughput,
        "request_throughput": s.request_throughput,
        "num_requests": s.num_requests,
        "num_completed": s.num_completed,
        "duration_s": s.duration_s,
        "tpot_attainment": s.tpot_attainment,
        "num_steps": result.engine.get("num_steps"),
        "mean_step_time_ms": 1e3 * result.engine.get("mean_step_time_s", 0.0),
        "num_preemptions": result.engine.get("num_preemptions"),
    }
    print(f"threshold {threshold}: ITL p50/p90/p99 {row['itl_ms']['p50']:.1f}/"
          f"{row['itl_ms']['p90']:.1f}/{row['itl_ms']['p99']:.1f} ms, TTFT p50/p90 "
          f"{row['ttft_ms']['p50']:.0f}/{row['ttft_ms']['p90']:.0f} ms, "
          f"{s.output_throughput:.0f} output tok/s, {s.num_completed}/{s.num_requests} done")
    return row


def choose(rows: list[dict[str, Any]], slo_ms: float, percentile: str) -> dict[str, Any]:
    """The largest cap (none counts as the largest) whose ITL at `percentile` meets the
    SLO: the least TTFT paid for it. None when no setting meets it."""
    def size(row: dict[str, Any]) -> float:
        t = row["effective_long_prefill_token_threshold"]
        return float("inf") if t == 0 else t

    meeting = [r for r in rows
               if r["itl_ms"][percentile] is not None and r["itl_ms"][percentile] <= slo_ms]
    if not meeting:
        return {"long_prefill_token_threshold": None,
                "reason": f"no setting has ITL {percentile} <= {slo_ms} ms"}
    best = max(meeting, key=size)
    base = next((r for r in rows if r["effective_long_prefill_token_threshold"] == 0), None)
    out = {"long_prefill_token_threshold": best["long_prefill_token_threshold"],
           f"itl_{percentile}_ms": best["itl_ms"][percentile],
           "ttft_p50_ms": best["ttft_ms"]["p50"], "ttft_p90_ms": best["ttft_ms"]["p90"]}
    if base is not None and base["ttft_ms"]["p50"]:
        out["ttft_p50_vs_no_cap"] = best["ttft_ms"]["p50"] / base["ttft_ms"]["p50"]
        out["ttft_p90_vs_no_cap"] = best["ttft_ms"]["p90"] / base["ttft_ms"]["p90"]
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    engine_args = EngineArgs(
        model=args.model, load_format=args.load_format, max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_num_partial_prefills=args.max_num_partial_prefills)
    workload = leval_workload(args, engine_args)
    print(f"workload: {workload.summary()}")
    thresholds = [int(t) for t in args.thresholds.split(",") if t.strip()]
    rows = [run_setting(args, engine_args, workload, t) for t in thresholds]
    write_result(args.out, {
        "mode": f"simulated {args.gpu}" if args.simulate else "gpu",
        "calibration": args.calibration,
        "engine": {"model": args.model, "load_format": args.load_format,
                   "max_model_len": args.max_model_len,
                   "max_num_batched_tokens": args.max_num_batched_tokens,
                   "max_num_partial_prefills": args.max_num_partial_prefills,
                   "kv_policy": "recompute"},
        "workload": {**workload.spec.to_dict(), **workload.summary()},
        "tpot_slo_ms": args.slo_tpot_ms,
        "settings": rows,
        # The largest threshold whose ITL p90 (the criterion) / p99 meets the SLO.
        "choice": {p: choose(rows, args.slo_tpot_ms, p) for p in ("p90", "p99")},
    })


if __name__ == "__main__":
    main()
