"""The fastest the offline ShareGPT run could go on the H200: a roofline of its schedule.

With as many seats as requests the run prefills every prompt up front and then decodes all
requests together, one token each a step, until the longest output ends. Each step is priced
at its operators' floors (`roofline` of bench_gpu_path: the linear layers at the larger of
weight-read time and FLOPs at the bf16 peak, plus the KV the decode attention reads at HBM
speed); the prefill at its linear layers' FLOPs. No launch, attention compute, elementwise
kernel or host time is counted, so a real run can only be slower. With --measured, the
fraction of this floor an offline result file reached.

  python -m benchmarks.offline.offline_floor --workload .carry/sharegpt_llama31_1000.json \\
      --measured results/offline/offline_sharegpt_h200_async_1024_16k_graphs1024.json \\
      --out results/offline/offline_floor_h200.json
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.common import H200_BF16_FLOPS, H200_HBM_BYTES_PER_S, batch_bin, write_result
from benchmarks.gpu_path.bench_gpu_path import decode_bytes, roofline, weight_bytes
from kvtier.model.loader import resolve_model_config


def decode_floor(mc, prompts: np.ndarray, outputs: np.ndarray, at_batches: list[int],
                 small: int = 64) -> dict:
    """Sum of the decode steps' floors; step t serves every request with more than t output
    tokens, at context prompt + t + 1. `at_batches`: the floors of the first step of each of
    these batch sizes (or the first below it), to set beside a profile of such a step."""
    total = kv_total = small_s = 0.0
    steps = small_steps = 0
    at: dict[int, dict] = {}
    by_batch: dict[str, dict] = {}
    for t in range(int(outputs.max())):
        alive = outputs > t
        batch = int(alive.sum())
        context = int((prompts[alive] + t + 1).sum())
        weights, kv = decode_bytes(mc, 1, context)  # KV of `context` tokens in all
        per_op = roofline(weights, kv, batch)[1]
        total += per_op
        kv_total += kv / H200_HBM_BYTES_PER_S
        for b in at_batches:  # the first step down to each size
            if b not in at and batch <= b:
                at[b] = {"step": t, "batch": batch, "mean_context": context / batch,
                         "linear_s": per_op - kv / H200_HBM_BYTES_PER_S,
                         "kv_read_s": kv / H200_HBM_BYTES_PER_S, "floor_s": per_op}
        cell = by_batch.setdefault(batch_bin(batch), {"count": 0, "total_s": 0.0})
        cell["count"] += 1
        cell["total_s"] += per_op
        steps += 1
        if batch < small:
            small_s += per_op
            small_steps += 1
    return {"steps": steps, "seconds": total, "kv_read_s": kv_total,
            "linear_s": total - kv_total,
            f"batch_lt_{small}": {"steps": small_steps, "seconds": small_s},
            "steps_at_batch": at, "by_batch": by_batch}


def compare_by_batch(floor: dict[str, dict], measured: dict[str, dict]) -> dict[str, dict]:
    """Per batch range: measured decode-only seconds beside the floor's (a measured run's
    step count in a range can differ by a few steps: prefill chunks mix with decodes)."""
    out = {}
    for label, f in floor.items():
        m = measured.get(label, {"count": 0, "total_s": 0.0})
        out[label] = {"floor_steps": f["count"], "floor_s": f["total_s"],
                      "measured_steps": m["count"], "measured_s": m.get("total_s", 0.0),
                      "excess_s": m.get("total_s", 0.0) - f["total_s"]}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True, help="prepare_workload.py output")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--measured", help="an offline result JSON to compare with")
    ap.add_argument("--at-batches", type=int, nargs="*", default=[984, 664, 178],
                    help="report the floors of a step of these batch sizes (the profiled ones)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    reqs = json.load(open(args.workload))["requests"]
    prompts = np.array([len(p) for p, _ in reqs])
    outputs = np.array([o for _, o in reqs])
    mc, _ = resolve_model_config(args.model, "dummy")
    prefill_s = int(prompts.sum()) * weight_bytes(mc) / H200_BF16_FLOPS
    decode = decode_floor(mc, prompts, outputs, args.at_batches)
    total_s = prefill_s + decode["seconds"]
    result = {"model": args.model, "workload": args.workload, "requests": len(reqs),
              "prompt_tokens": int(prompts.sum()), "output_tokens": int(outputs.sum()),
              "prefill_s": prefill_s, "decode": decode, "total_s": total_s,
              "output_tokens_per_s": int(outputs.sum()) / total_s}
    if args.measured:
        m = json.load(open(args.measured))
        result["measured"] = {"file": args.measured, "elapsed_s": m["elapsed_s"],
                              "output_tokens_per_s": m["output_tokens_per_s"],
                              "fraction_of_floor": total_s / m["elapsed_s"]}
        if "decode_only_by_batch" in m["steps"]:
            result["measured"]["by_batch"] = compare_by_batch(
                decode["by_batch"], m["steps"]["decode_only_by_batch"])
    print(json.dumps({k: v for k, v in result.items() if k != "workload"}, indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
