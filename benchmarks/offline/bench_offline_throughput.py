"""Offline throughput (vLLM's benchmark_throughput): every request at once, input and output
lengths from the dataset, ignore_eos, one engine. Reports output and total tokens/s.

  python -m benchmarks.offline.bench_offline_throughput \
      --workload .carry/sharegpt_llama31_1000.json \
      --model llama-3.1-8b --out results/offline/offline_sharegpt_h200.json

Async scheduling is on here as it is by default on a GPU (vLLM's default too, and SGLang's
overlap scheduler); `--no-async-scheduling` measures the synchronous engine. Batch limits
not given are the offline LLM's defaults for the GPU (on the H200: 1024 seats, 16,384
tokens a step, decode graphs up to 1024; `kvtier/engine/batch_defaults.py`); the result's
`engine` records what ran.
"""

from __future__ import annotations

import argparse
import bisect
import json
import time

from benchmarks.common import batch_bin, write_result
from kvtier import LLM, SamplingParams
from kvtier.bench.gpu_monitor import GpuMonitor, GpuSummary


def step_label(reqs: int, tokens: int) -> str:
    """A decode-only step's batch range, or "mixed" (prefill rows in it)."""
    return batch_bin(reqs) if tokens <= reqs else "mixed"


def step_summary(steps: list[tuple[float, int, int]]) -> dict:
    """Time split between decode-only steps (one token per request) and mixed ones."""
    dec = [s for s in steps if s[2] <= s[1]]
    mixed = [s for s in steps if s[2] > s[1]]

    def part(rows: list[tuple[float, int, int]]) -> dict:
        if not rows:
            return {"count": 0}
        return {"count": len(rows), "total_s": sum(r[0] for r in rows),
                "mean_ms": 1e3 * sum(r[0] for r in rows) / len(rows),
                "mean_tokens": sum(r[2] for r in rows) / len(rows)}

    small = [s for s in dec if s[1] < 64]
    bins: dict[str, list[tuple[float, int, int]]] = {}  # in the order the run reaches them
    for s in dec:
        bins.setdefault(step_label(s[1], s[2]), []).append(s)
    return {"decode_only": part(dec), "mixed": part(mixed), "decode_only_batch_lt_64": part(small),
            "decode_only_by_batch": {k: part(v) for k, v in bins.items()}}


def gpu_by_batch(gpu: GpuSummary, starts: list[float], steps: list[tuple[float, int, int]]
                 ) -> dict:
    """NVML's samples grouped by the batch range of the step running when each was taken
    (mixed steps apart): is the GPU ever idle, and at what power and SM clock, per range."""
    groups: dict[str, list] = {}
    for smp in gpu.samples:
        i = bisect.bisect_right(starts, smp.t_s) - 1
        if 0 <= i < len(steps):
            groups.setdefault(step_label(steps[i][1], steps[i][2]), []).append(smp)
    sums = {k: GpuSummary(gpu.device_name, tuple(v), 0.0, 0.0) for k, v in groups.items()}
    return {k: {"samples": len(g.samples), "gpu_util_pct": g.mean_gpu_util_pct,
                "power_w": g.mean_power_w, "sm_clock_mhz": g.mean_sm_clock_mhz}
            for k, g in sums.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", required=True)
    # Unset: the offline LLM's defaults for this GPU (kvtier/engine/batch_defaults.py; on
    # the H200 1024 seats, 16,384 tokens a step, decode graphs up to 1024).
    ap.add_argument("--max-num-seqs", type=int)
    ap.add_argument("--max-num-batched-tokens", type=int)
    ap.add_argument("--layers-per-block", type=int, default=4)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--piecewise-graphs", action=argparse.BooleanOptionalAction, default=True,
                    help="CUDA graphs around attention for mixed steps")
    ap.add_argument("--max-graph-batch-size", type=int,
                    help="largest decode batch with a full CUDA graph")
    ap.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                    help="launch step N+1 before reading step N's tokens (the engine's "
                         "--async-scheduling, on by default on a GPU; "
                         "--no-async-scheduling: one step at a time)")
    args = ap.parse_args()
    work = json.load(open(args.workload))
    reqs = work["requests"]
    t_start = time.perf_counter()
    limits = {k: v for k, v in (("max_num_seqs", args.max_num_seqs),
                                ("max_num_batched_tokens", args.max_num_batched_tokens),
                                ("max_graph_batch_size", args.max_graph_batch_size))
              if v is not None}
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_model_len=4096,
              layers_per_block=args.layers_per_block, swap_space=1,
              gpu_memory_utilization=args.gpu_memory_utilization,
              piecewise_graphs=args.piecewise_graphs, async_scheduling=args.async_scheduling,
              **limits)
    startup_s = time.perf_counter() - t_start  # weights, KV pool, kernel warm-up, graphs
    warm = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True, detokenize=False)]
    llm.generate([{"prompt_token_ids": reqs[0][0]}], warm)
    engine = llm.engine
    for i, (prompt, out) in enumerate(reqs):
        engine.add_request(str(i), prompt, SamplingParams(
            temperature=0.0, max_tokens=out, ignore_eos=True, detokenize=False,
            output_kind="final_only"))
    # (wall s, requests, tokens) per step: where the time goes. Under async scheduling a
    # step's wall time is the loop's period (host work and the GPU overlap), not one step's.
    steps = []
    starts = []  # each step's start, on the GPU monitor's clock
    n_out = 0
    monitor = GpuMonitor.create(interval_s=0.02)
    if monitor is not None:
        monitor.start()
    t0 = time.perf_counter()
    m0 = time.monotonic()
    while engine.has_unfinished_requests():
        s0 = time.perf_counter()
        starts.append(time.monotonic() - m0)
        done = engine.step()
        st = engine.get_stats()
        n_out += sum(len(o.outputs[0].token_ids) for o in done)
        steps.append((time.perf_counter() - s0, st.num_scheduled_requests, st.num_scheduled_tokens))
    elapsed = time.perf_counter() - t0
    gpu = monitor.stop() if monitor is not None else None
    n_in = sum(len(p) for p, _ in reqs)
    assert n_out == sum(out for _, out in reqs), "every request must produce its full output"
    stats = llm.engine.get_stats()
    result = {
        "model": args.model, "workload": {k: v for k, v in work.items() if k != "requests"},
        "num_requests": len(reqs), "prompt_tokens": n_in, "output_tokens": n_out,
        "elapsed_s": elapsed, "requests_per_s": len(reqs) / elapsed,
        "output_tokens_per_s": n_out / elapsed, "total_tokens_per_s": (n_in + n_out) / elapsed,
        "startup_s": startup_s, "num_preemptions": stats.num_preemptions_total, "gpu_blocks_total": stats.gpu_blocks_total,
        "steps": step_summary(steps),
        "gpu": None if gpu is None else {**gpu.to_dict(n_out),
                                         "by_batch": gpu_by_batch(gpu, starts, steps)},
        "options": vars(args),
        # What the engine ran with, defaults resolved.
        "engine": {"max_num_seqs": llm.engine.config.scheduler.max_num_seqs,
                   "max_num_batched_tokens": llm.engine.config.scheduler.max_num_batched_tokens,
                   "max_graph_batch_size": llm.engine.config.max_graph_batch_size,
                   "async_scheduling": llm.engine.config.scheduler.async_scheduling},
    }
    print(json.dumps(result, indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
