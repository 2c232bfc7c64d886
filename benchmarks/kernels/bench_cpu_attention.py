"""CPU microbenchmark of the host-KV decode attention kernel (kvtier/kernels/cpu_attention.py).

Llama-3.1-8B geometry (32 query heads, 8 KV heads, head_dim 128, bf16, 16-token pages), one
layer, batch x context shapes (default 1x8192, 8x4096, 32x2048, 64x1024). Reported per shape:
GB/s of KV read (K and V bytes of the contexts / median time) for

  - the C++ kernel, over pages in shuffled order (a host pool's pages are scattered);
  - torch SDPA over the same KV laid out contiguously [B, Hkv, ctx, D], asked two ways:
    enable_gqa, and each query-head group as G query rows of its KV head (`sdpa_variants`),

against the host's memory read bandwidth measured in the same run (the sum of a 2 GiB fp32
tensor). Each timed call reads a different copy of the layer, cycling through 1 GiB of copies
(32 at most; every default shape reaches 1 GiB), so no call is served from the last-level
cache. Every shape checks the kernel against SDPA first. CPU only; no GPU needed.

    python -m benchmarks.kernels.bench_cpu_attention --out cpu_attention.json [--threads 16]
    python -m benchmarks.kernels.bench_cpu_attention --shapes 1x1024,4x512 --threads 2 --out x.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import write_result  # noqa: E402
from kvtier.bench.environment import cpu_name  # noqa: E402
from kvtier.kernels.cpu_attention import cpu_decode_attention  # noqa: E402
from kvtier.kernels.cpu_attention_build import CFLAGS, cpu_attention_extension  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
DEFAULT_SHAPES = "1x8192,8x4096,32x2048,64x1024"
ROTATE_BYTES = 1 << 30  # at least this many bytes of KV copies cycled through per shape


# Wall clock; `--clock thread` (one thread only) counts the calling thread's CPU time instead,
# which a machine shared with other jobs leaves unchanged while the wall clock doubles.
CLOCK: Callable[[], float] = time.perf_counter


def median_s(fn: Callable[[], Any], iters: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return statistics.median(times)


def host_read_gbps(iters: int) -> float:
    """Memory read bandwidth: one pass of sum() over a 2 GiB fp32 tensor."""
    x = torch.ones(1 << 29, dtype=torch.float32)
    return x.numel() * 4 / median_s(lambda: x.sum(), iters) / 1e9


def cpu_flags_of_interest() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((ln.split(":", 1)[1].split() for ln in text.splitlines()
                  if ln.startswith("flags")), [])
    return sorted(f for f in flags if f.startswith(("avx512", "amx")) or f in ("avx2", "fma"))


def make_layer(batch: int, ctx: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    """One layer of host KV for `batch` requests of `ctx` tokens, pages shuffled."""
    per_req = -(-ctx // PAGE_SIZE)
    num_pages = batch * per_req
    shape = (num_pages, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM)
    k = torch.randn(shape, generator=gen).to(torch.bfloat16)
    v = torch.randn(shape, generator=gen).to(torch.bfloat16)
    tables = torch.randperm(num_pages, generator=gen).to(torch.int32).view(batch, per_req)
    return {"k": k, "v": v, "tables": tables}


def contiguous_kv(layer: dict[str, torch.Tensor], ctx: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, Hkv, ctx, D] copies of the layer's K and V in token order (what SDPA reads)."""
    def gather(pages: torch.Tensor) -> torch.Tensor:
        tiles = pages[layer["tables"].long()]  # [B, n, Hkv, P, D]
        b, n = tiles.shape[:2]
        return tiles.permute(0, 2, 1, 3, 4).reshape(b, NUM_KV_HEADS, n * PAGE_SIZE, HEAD_DIM)[
            :, :, :ctx].contiguous()
    return gather(layer["k"]), gather(layer["v"])


def bench_shape(batch: int, ctx: int, threads: int, iters: int, sdpa: bool,
                pages_per_split: int | None) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch * 100003 + ctx)
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * 2
    copies = max(1, min(32, -(-ROTATE_BYTES // kv_bytes)))
    first = make_layer(batch, ctx, gen)  # the copies differ in address only: randn is slow
    layers = [first] + [{name: t.clone() for name, t in first.items()} for _ in range(copies - 1)]
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    out = torch.empty(batch, NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    it = iter(range(1 << 62))

    def kernel() -> None:
        layer = layers[next(it) % copies]
        cpu_decode_attention(q, layer["k"], layer["v"], layer["tables"], lens, out=out,
                             num_threads=threads, pages_per_split=pages_per_split)

    row: dict[str, Any] = {"batch": batch, "context": ctx, "kv_bytes": kv_bytes,
                           "copies_cycled": copies}
    row["kernel_s"] = median_s(kernel, iters)
    row["kernel_gbps"] = round(kv_bytes / row["kernel_s"] / 1e9, 2)
    if sdpa:
        dense = [contiguous_kv(layer, ctx) for layer in layers]
        got = cpu_decode_attention(q, layers[0]["k"], layers[0]["v"], layers[0]["tables"], lens,
                                   out_dtype=torch.float32, num_threads=threads)[0]
        k0, v0 = dense[0]
        want = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k0.float(), v0.float(),
                                              enable_gqa=True).squeeze(2)
        grouped = F.scaled_dot_product_attention(
            q.float().view(batch, NUM_KV_HEADS, -1, HEAD_DIM), k0.float(), v0.float())
        row["max_abs_err_vs_sdpa_fp32"] = (got - want).abs().max().item()
        row["sdpa_grouped_vs_gqa_max_abs"] = (grouped.view_as(want) - want).abs().max().item()
        assert row["max_abs_err_vs_sdpa_fp32"] < 1e-3 and row["sdpa_grouped_vs_gqa_max_abs"] < 1e-4, row
        for name, run in sdpa_variants(q, dense, it).items():
            row[f"{name}_s"] = median_s(run, iters)
            row[f"{name}_gbps"] = round(kv_bytes / row[f"{name}_s"] / 1e9, 2)
    return row


def sdpa_variants(q: torch.Tensor, dense: list[tuple[torch.Tensor, torch.Tensor]],
                  it: Iterator[int]) -> dict[str, Callable[[], Any]]:
    """Two ways to ask torch SDPA for GQA decode over contiguous KV: `enable_gqa` (one query
    token per head), and each KV head's query-head group as G query rows of one head (no mask:
    at decode every query row sees the whole context), which reads each KV row once."""
    batch = q.shape[0]
    q_heads = q.unsqueeze(2)  # [B, Hq, 1, D]
    q_groups = q.view(batch, NUM_KV_HEADS, NUM_HEADS // NUM_KV_HEADS, HEAD_DIM)  # [B, Hkv, G, D]

    def gqa() -> None:
        k, v = dense[next(it) % len(dense)]
        F.scaled_dot_product_attention(q_heads, k, v, enable_gqa=True)

    def grouped() -> None:
        k, v = dense[next(it) % len(dense)]
        F.scaled_dot_product_attention(q_groups, k, v)

    return {"sdpa_enable_gqa": gqa, "sdpa_grouped_rows": grouped}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="BATCHxCONTEXT,...")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--pages-per-split", type=int, default=None,
                    help="the kernel's split size (default: its own choice)")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the torch SDPA baseline")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="thread: CPU time of the calling thread (needs --threads 1)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.clock == "thread":
        if args.threads != 1:
            sys.exit("--clock thread measures the calling thread only: use it with --threads 1")
        global CLOCK
        CLOCK = time.thread_time
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    ext = cpu_attention_extension()
    if ext is None:
        sys.exit("the C++ kernel could not be built (see the warning above); nothing to measure")
    build_s = time.perf_counter() - t0
    read_gbps = host_read_gbps(args.iters)
    print(f"host read {read_gbps:.1f} GB/s, {args.threads} threads, kernel isa {ext.isa}")
    rows = []
    for shape in args.shapes.split(","):
        batch, ctx = (int(x) for x in shape.lower().split("x"))
        row = bench_shape(batch, ctx, args.threads, args.iters, not args.no_sdpa,
                          args.pages_per_split)
        row["kernel_pct_of_host_read"] = round(100 * row["kernel_gbps"] / read_gbps, 1)
        print({k: row[k] for k in row if k.endswith(("gbps", "pct_of_host_read", "context", "batch"))})
        rows.append(row)
    write_result(args.out, {
        "host": {"cpu_model": cpu_name(), "logical_cpus": os.cpu_count(),
                 "flags": cpu_flags_of_interest()},
        "threads": args.threads, "clock": args.clock, "kernel_isa": ext.isa,
        "kernel_cflags": list(CFLAGS), "pages_per_split": args.pages_per_split,
        "openmp_env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_"))}, "build_or_load_s": round(build_s, 2),
        "host_read_gbps": round(read_gbps, 2),
        "geometry": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                     "page_size": PAGE_SIZE, "dtype": "bfloat16"},
        "rows": rows, "elapsed_s": round(time.perf_counter() - t0, 1),
    })


if __name__ == "__main__":
    main()
