"""Where the host tier stops paying, measured: a request's TTFT when its prefix of L tokens
is computed (miss), loaded from the host tier (host hit) or found on the device (device
hit), for L = 16 ... 16384, beside the cost model's prediction of the same three
(benchmarks/policies/strata_breakeven.py, which gives it without a GPU).

Per length and repetition, on one engine per io-backend (dummy weights, greedy, one output
token, synchronous steps, so a request's TTFT is the wall time of the steps that serve it):
  miss         a new random prefix + a question of --question-tokens: every token computed
               (the write-through policy stores the prefix's blocks in the host tier)
  host hit     the device tier's cached blocks evicted (`KVCacheManager.evict`; their host
               copies stay), the same prefix + another question: the prefix's blocks load
               layer group by layer group beside the question's prefill
  device hit   the same prefix + a third question: the blocks the host hit loaded are
               cached on the device again
Each row records the host-hit and device-hit tokens the engine counted, so a row whose
request did not hit as planned shows it. The crossover is the shortest L from which every
longer one has miss / host hit > 1.

  python -m benchmarks.policies.bench_strata_breakeven --out results/policies/strata_breakeven_measured_h200.json
                                                      (H200, Llama-3.1-8B dummy; ~1 minute)
  python -m benchmarks.policies.bench_strata_breakeven --quick --device cpu --out /tmp/b.json
                                                      (CPU smoke run of the logic)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

LENGTHS = tuple(4 ** k for k in range(2, 8))  # 16 ... 16384
QUICK_LENGTHS = (16, 64)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="dummy preset")
    p.add_argument("--device", default="cuda", help="cuda | cpu (cpu: a smoke run only)")
    p.add_argument("--io-backends", default="direct,kernel", help="--hicache-io-backend values")
    p.add_argument("--question-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3, help="prefixes per length (median)")
    p.add_argument("--kv-cache-gb", type=float, default=8.0)
    p.add_argument("--host-gib", type=float, default=8.0)
    p.add_argument("--quick", action="store_true", help="tiny-llama-gqa, L = 16 and 64")
    p.add_argument("--out", required=True, help="result JSON (benchmarks/common.write_result)")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.repeats, args.question_tokens = "tiny-llama-gqa", 2, 16
    return args


def make_engine(args: argparse.Namespace, io_backend: str) -> Any:
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.offload.args import HostTierArgs

    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    extra = {} if args.device == "cuda" else {"num_gpu_blocks": 4096}
    engine_args = EngineArgs(
        model=args.model, load_format="dummy", device=args.device,
        kv_cache_gb=args.kv_cache_gb if args.device == "cuda" else None,
        max_model_len=max(lengths) + args.question_tokens + 1, async_scheduling=False,
        host_tier=HostTierArgs(kv_offloading_size=args.host_gib, hicache_io_backend=io_backend,
                                hicache_min_load_blocks=1),  # every length loads
        **extra)
    return LLMEngine.from_engine_args(engine_args)


def serve(engine: Any, request_id: str, prompt: list[int]) -> dict[str, float]:
    """One request alone, to its first (and only) token: TTFT and what the caches gave."""
    from kvtier.sampling_params import SamplingParams

    before = engine.get_stats()
    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True, detokenize=False)
    t0 = time.perf_counter()
    engine.add_request(request_id, prompt, params)
    while engine.has_unfinished_requests():
        engine.step()
    ttft = time.perf_counter() - t0
    after = engine.get_stats()
    return {"ttft_s": ttft,
            "host_hit_tokens": _host_hits(after) - _host_hits(before),
            "device_hit_tokens": _device_hits(after) - _device_hits(before)}


def _host_hits(stats: Any) -> int:
    return stats.host_tier.host_hit_tokens if stats.host_tier is not None else 0


def _device_hits(stats: Any) -> int:
    return stats.num_prefix_cache_hits_total


def measure_length(engine: Any, length: int, args: argparse.Namespace,
                   rng: random.Random) -> dict[str, Any]:
    """Median over --repeats fresh prefixes of the three TTFTs at one length."""
    vocab = engine.model_config.vocab_size
    runs: dict[str, list[dict[str, float]]] = {"miss": [], "host_hit": [], "device_hit": []}
    for rep in range(args.repeats):
        prefix = [rng.randrange(100, vocab) for _ in range(length)]
        for kind in runs:
            if kind == "host_hit":
                engine.kv_manager.evict(engine.kv_manager.gpu.num_blocks)
            question = [rng.randrange(100, vocab) for _ in range(args.question_tokens)]
            runs[kind].append(serve(engine, f"L{length}-{rep}-{kind}", prefix + question))
        engine.kv_manager.check_integrity()
    row: dict[str, Any] = {"tokens": length}
    for kind, rs in runs.items():
        row[f"{kind}_ttft_s"] = statistics.median(r["ttft_s"] for r in rs)
        row[f"{kind}_host_hit_tokens"] = [r["host_hit_tokens"] for r in rs]
        row[f"{kind}_device_hit_tokens"] = [r["device_hit_tokens"] for r in rs]
    row["miss_over_host_hit"] = row["miss_ttft_s"] / row["host_hit_ttft_s"]
    row["miss_over_device_hit"] = row["miss_ttft_s"] / row["device_hit_ttft_s"]
    return row


def predicted(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """The cost model's request view of the same lengths (strata_breakeven's rows)."""
    from benchmarks.policies.strata_breakeven import MODELS, cost_model, row

    if args.model not in MODELS:
        return {}
    model_args = argparse.Namespace(gpu="h200", calibration=True, max_num_batched_tokens=None)
    cm, config = cost_model(args.model, model_args)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    return {n: row(cm, config, n, args.question_tokens) for n in lengths}


def run_backend(args: argparse.Namespace, io_backend: str,
                model: dict[int, dict[str, float]]) -> dict[str, Any]:
    from benchmarks.policies.strata_breakeven import crossover

    engine = make_engine(args, io_backend)
    rng = random.Random(0)
    lengths = QUICK_LENGTHS if args.quick else LENGTHS
    measure_length(engine, lengths[0], args, rng)  # warm-up: kernels compile, graphs load
    rows = []
    for n in lengths:
        r = measure_length(engine, n, args, rng)
        if n in model:
            m = model[n]
            r["predicted_miss_s"] = m["request_miss_s"]
            r["predicted_host_hit_s"] = m[f"request_hit_{io_backend}_s"]
            r["predicted_miss_over_host_hit"] = m[f"request_speedup_{io_backend}"]
        print(f"{io_backend:7s} L={n:6d}: miss {1e3 * r['miss_ttft_s']:8.2f} ms  host hit "
              f"{1e3 * r['host_hit_ttft_s']:8.2f} ms  device hit "
              f"{1e3 * r['device_hit_ttft_s']:8.2f} ms  miss/host {r['miss_over_host_hit']:.2f}")
        rows.append(r)
    engine.close()
    out = {"rows": rows, "crossover_tokens": crossover(rows, "miss_over_host_hit")}
    if model:
        out["predicted_crossover_tokens"] = crossover(
            [r for r in rows if "predicted_miss_over_host_hit" in r],
            "predicted_miss_over_host_hit")
    return out


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import write_result

    args = parse_args(argv)
    model = predicted(args)
    results = {b: run_backend(args, b, model) for b in args.io_backends.split(",")}
    write_result(args.out, {"model": args.model, "question_tokens": args.question_tokens,
                            "repeats": args.repeats, "io_backends": results})


if __name__ == "__main__":
    main()
