"""What one call of NEO's CPU attention costs beyond its KV reads, at small shapes.

NEO called the kernel once a layer through a Python worker thread (`CpuAttentionWorker`)
until its layer calls moved to the kernel's own native thread (4d7d04a;
benchmarks/policies/bench_neo_layer.py measures those in a step); this splits the call as it
was. Per shape (Llama-3.1-8B geometry, bf16 pages) the median of:

  - `kernel`: the C++ entry point alone, its arguments prepared once;
  - `wrapper`: `cpu_decode_attention` (argument checks, the fp32 q, the output tensors);
  - `worker`: the wrapper through `CpuAttentionWorker.submit(...).result()`, as NEO's
    sequential steps waited for it;
  - and, once, an empty task's round trip through a one-thread `ThreadPoolExecutor`.

`python -m benchmarks.kernels.bench_cpu_attention_call --threads 16 --out ...`
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.kernels.bench_cpu_attention import (  # noqa: E402
    HEAD_DIM,
    NUM_HEADS,
    NUM_KV_HEADS,
    PAGE_SIZE,
    make_layer,
)
from kvtier.bench.environment import cpu_name  # noqa: E402
from kvtier.kernels.cpu_attention import (  # noqa: E402
    CpuAttentionTuning,
    CpuAttentionWorker,
    cpu_decode_attention,
    extension_args,
)
from kvtier.kernels.cpu_attention_build import cpu_attention_extension  # noqa: E402

DEFAULT_SHAPES = "1x16,1x256,4x256,1x2048,4x2048"


def median_us(fn: Callable[[], Any], iters: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(statistics.median(times) * 1e6, 1)


def problem(batch: int, ctx: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(batch * 7919 + ctx)
    return {**make_layer(batch, ctx, gen),
            "q": torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16),
            "lens": torch.full((batch,), ctx, dtype=torch.int32)}


def kernel_call(ext: Any, p: dict[str, torch.Tensor], threads: int) -> Callable[[], None]:
    """The C++ entry point with every argument computed beforehand."""
    q32 = p["q"].float().contiguous()
    out = torch.empty(q32.shape, dtype=torch.bfloat16)
    lse = torch.empty(q32.shape[:2], dtype=torch.float32)
    args = extension_args(q32, p["k"], p["v"], p["tables"], p["lens"], out, lse,
                          HEAD_DIM**-0.5, threads, None, CpuAttentionTuning())
    keep = (q32, out, lse, p)  # the pointers above stay valid while the closure lives

    def run() -> None:
        assert keep
        ext.decode_attention(**args)
    return run


def bench_shape(ext: Any, worker: CpuAttentionWorker, batch: int, ctx: int,
                args: argparse.Namespace) -> dict[str, Any]:
    p = problem(batch, ctx)
    call = (p["q"], p["k"], p["v"], p["tables"], p["lens"])
    row: dict[str, Any] = {"batch": batch, "context": ctx,
                           "kv_bytes": 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * 2}
    row["kernel_us"] = median_us(kernel_call(ext, p, args.threads), args.iters)
    row["wrapper_us"] = median_us(
        lambda: cpu_decode_attention(*call, num_threads=args.threads), args.iters)
    row["worker_us"] = median_us(
        lambda: worker.submit(*call, num_threads=args.threads).result(), args.iters)
    row["wrapper_over_kernel_us"] = round(row["wrapper_us"] - row["kernel_us"], 1)
    row["worker_over_wrapper_us"] = round(row["worker_us"] - row["wrapper_us"], 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="BATCHxCONTEXT,...")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    ext = cpu_attention_extension()
    if ext is None:
        sys.exit("the C++ kernel could not be built (see the warning above); nothing to measure")
    with ThreadPoolExecutor(max_workers=1) as pool:
        empty_us = median_us(lambda: pool.submit(int).result(), args.iters)
    print(f"empty thread-pool round trip: {empty_us} us")
    rows = []
    with CpuAttentionWorker() as worker:
        for shape in args.shapes.split(","):
            batch, ctx = (int(x) for x in shape.lower().split("x"))
            rows.append(bench_shape(ext, worker, batch, ctx, args))
            print(rows[-1])
    write_result(args.out, {
        "host": {"cpu_model": cpu_name(), "logical_cpus": os.cpu_count()},
        "threads": args.threads, "iters": args.iters, "kernel_isa": ext.isa,
        "geometry": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                     "page_size": PAGE_SIZE, "dtype": "bfloat16"},
        "empty_thread_pool_round_trip_us": empty_us, "rows": rows,
    })


if __name__ == "__main__":
    main()
