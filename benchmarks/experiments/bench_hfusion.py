"""Horizontal fusion (eLLM item 4): one launch for a prefix-recompute prefill and a decode, vs
the two kernels on two CUDA streams and vs the two kernels one after the other.

Shapes: a decode batch of B requests at context `ctx` (layer i's decode) and, for a quarter
of them, a causal prefill over a recomputed prefix of `prefix` tokens (layer i+1's
recompute attention), two layer views of one paged pool. For each variant:
  gpu_us   device time of one call (CUDA events, the host kept ahead by a sleep kernel)
  host_us  host time to issue one call (time.perf_counter)
  loop_us  back-to-back calls, events around the loop: max(host, GPU) as a step sees it
plus each kernel alone, so `sum` (sequential) and `max` (perfect overlap) are on record.

  python -m benchmarks.experiments.bench_hfusion \
      --out results/experiments/hfusion_h200.json   (~30 s)
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

MODELS = {  # (Hq, Hkv, head_dim)
    "llama-3.1-8b": (32, 8, 128),
    "llama-2-13b": (40, 40, 128),
}
CASES = [(64, 1024, 64), (64, 1024, 512), (256, 1024, 512), (64, 4096, 512),
         (256, 4096, 64), (256, 4096, 512)]  # (decode batch, context, recompute prefix)
QUICK_CASES = [(64, 1024, 512), (256, 4096, 512)]
BLOCK_SIZE, LAYERS_PER_BLOCK = 16, 2


def _median_us(samples: list[float]) -> float:
    return round(1e6 * statistics.median(samples), 2)


def measure(fn: Callable[[], Any], reps: int) -> dict[str, float]:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    gpu, host = [], []
    for _ in range(reps):
        torch.cuda._sleep(2_000_000)  # ~1 ms: the host queues the call before the GPU gets to it
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        t0 = time.perf_counter()
        fn()
        host.append(time.perf_counter() - t0)
        end.record()
        end.synchronize()
        gpu.append(start.elapsed_time(end) / 1e3)
    n = 20
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(n):
        fn()
    end.record()
    end.synchronize()
    return {"gpu_us": _median_us(gpu), "host_us": _median_us(host),
            "loop_us": round(1e3 * start.elapsed_time(end) / n, 2)}


def bench_case(model: str, batch: int, ctx: int, prefix: int, reps: int) -> dict[str, Any]:
    import torch

    from benchmarks.experiments.kernels.fused_attention import (
        DecodeProblem,
        PrefillProblem,
        decode_bytes,
        fused_paged_attention,
        prefill_flops,
    )
    from kvtier.kernels.launch import num_sms
    from kvtier.kernels.paged_decode_attention import paged_decode_attention
    from kvtier.kernels.paged_prefill_attention import paged_prefill_attention

    dev, dt = torch.device("cuda"), torch.bfloat16
    hq, hkv, d = MODELS[model]
    n_pre = max(1, batch // 4)
    dec_blocks = -(-ctx // BLOCK_SIZE)
    pre_blocks = -(-prefix // BLOCK_SIZE)
    num_blocks = batch * dec_blocks + n_pre * pre_blocks
    pool = torch.randn(num_blocks, LAYERS_PER_BLOCK, 2, BLOCK_SIZE, hkv, d, device=dev, dtype=dt)
    perm = torch.randperm(num_blocks, device=dev).to(torch.int32)
    dec_tables = perm[: batch * dec_blocks].view(batch, dec_blocks)
    pre_tables = perm[batch * dec_blocks :].view(n_pre, pre_blocks)
    dec_seq = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
    pre_seq = torch.full((n_pre,), prefix, dtype=torch.int32, device=dev)
    qsl = torch.arange(0, (n_pre + 1) * prefix, prefix, dtype=torch.int32, device=dev)
    dec_q = torch.randn(batch, hq, d, device=dev, dtype=dt)
    pre_q = torch.randn(n_pre * prefix, hq, d, device=dev, dtype=dt)
    dec_out, pre_out = torch.empty_like(dec_q), torch.empty_like(pre_q)
    scale = d**-0.5
    flops = prefill_flops([prefix] * n_pre, [prefix] * n_pre, hq, d)
    nbytes = decode_bytes([ctx] * batch, hkv, d, 2)
    # Layer i's decode reads slot 0, layer i+1's recompute slot 1 of the same pool.
    layer_i, layer_next = pool[:, 0], pool[:, 1]
    decode = DecodeProblem(dec_q, layer_i, dec_tables, dec_seq, out=dec_out,
                           max_seq_len=ctx, bytes=nbytes)
    prefill = PrefillProblem(pre_q, layer_next, pre_tables, pre_seq, qsl, out=pre_out,
                             num_tokens=n_pre * prefix, flops=flops)

    def run_decode() -> None:
        paged_decode_attention(dec_q, layer_i, dec_tables, dec_seq, scale, out=dec_out,
                               max_seq_len=ctx)

    def run_prefill() -> None:
        paged_prefill_attention(pre_q, layer_next, pre_tables, pre_seq, qsl, scale,
                                num_tokens=n_pre * prefix, out=pre_out)

    def sequential() -> None:
        run_decode()
        run_prefill()

    main = torch.cuda.current_stream()
    side = torch.cuda.Stream()

    def two_streams() -> None:
        side.wait_stream(main)
        run_decode()
        with torch.cuda.stream(side):
            run_prefill()
        main.wait_stream(side)

    sms = num_sms(dev)
    splits: dict[str, Any] = {}

    def fused(key: str, **kw: Any) -> Callable[[], None]:
        def call() -> None:
            _, _, split = fused_paged_attention(prefill, decode, scale, **kw)
            splits[key] = split.__dict__
        return call

    # Correctness of this very case before timing it.
    fused("check")()
    ref_dec, ref_pre = dec_out.clone(), pre_out.clone()
    sequential()
    err = max(((a.float() - b.float()).norm() / b.float().norm()).item()
              for a, b in ((ref_dec, dec_out), (ref_pre, pre_out)))

    variants = {
        "decode_alone": run_decode,
        "prefill_alone": run_prefill,
        "sequential": sequential,
        "two_streams": two_streams,
        "fused": fused("fused"),  # one program per item, interleaved
        "fused_stages3": fused("fused_stages3", num_stages=3),
        "fused_persistent": fused("fused_persistent", persistent=True),  # FLOP/byte split
        "fused_persistent_one_prefill_per_sm": fused(
            "fused_persistent_one_prefill_per_sm", persistent=True, prefill_programs=sms),
    }
    times = {name: measure(fn, reps) for name, fn in variants.items()}
    out = {
        "model": model, "batch": batch, "ctx": ctx, "prefix": prefix, "prefill_reqs": n_pre,
        "prefill_tflop": round(flops / 1e12, 4), "decode_gb": round(nbytes / 1e9, 3),
        "fused_vs_reference_rel_err": err,
        "splits": {k: v for k, v in splits.items() if k != "check"},
        **{f"{k}": v for k, v in times.items()},
        "speedup_fused_vs_sequential_gpu": round(
            times["sequential"]["gpu_us"] / times["fused"]["gpu_us"], 3),
        "speedup_fused_vs_two_streams_gpu": round(
            times["two_streams"]["gpu_us"] / times["fused"]["gpu_us"], 3),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--quick", action="store_true", help="two cases per model")
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import torch

    from benchmarks.common import write_result

    rows = []
    for model in args.models.split(","):
        for batch, ctx, prefix in QUICK_CASES if args.quick else CASES:
            r = bench_case(model, batch, ctx, prefix, args.reps)
            rows.append(r)
            sp = r["splits"]["fused_persistent"]
            torch.cuda.empty_cache()
            print(f"{model:13s} B={batch:3d} ctx={ctx:4d} prefix={prefix:3d} "
                  f"pers.split={sp['prefill_programs']}/{sp['decode_programs']} "
                  f"err={r['fused_vs_reference_rel_err']:.1e} | gpu us: "
                  f"dec {r['decode_alone']['gpu_us']:.0f} pre {r['prefill_alone']['gpu_us']:.0f} "
                  f"seq {r['sequential']['gpu_us']:.0f} 2str {r['two_streams']['gpu_us']:.0f} "
                  f"fused {r['fused']['gpu_us']:.0f} s3 {r['fused_stages3']['gpu_us']:.0f} "
                  f"pers {r['fused_persistent']['gpu_us']:.0f} "
                  f"pers/sm {r['fused_persistent_one_prefill_per_sm']['gpu_us']:.0f}"
                  f" | host us: seq {r['sequential']['host_us']:.0f} "
                  f"2str {r['two_streams']['host_us']:.0f} fused {r['fused']['host_us']:.0f}",
                  flush=True)
    write_result(args.out, {"bench": "hfusion", "dtype": "bfloat16", "block_size": BLOCK_SIZE,
                            "cases": rows})


if __name__ == "__main__":
    main()
