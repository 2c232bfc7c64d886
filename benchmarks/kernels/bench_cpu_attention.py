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

The breakdown that says where the time goes:
  - `thread_sweep`: kernel GB/s per thread count (--thread-sweep, default 1,4,8,16 capped at
    --threads), beside the host read bandwidth at the same count: per-thread scaling;
  - `compute_only`: the kernel over a context whose block table repeats a few pages (a hot set
    of --hot-kib, resident in L2), single thread and --threads: its rate without DRAM;
  - `tuning`: at --threads, the work split (`heads_per_item` 1 = one KV head an item, the
    layout before page spans), the software prefetch hint and distance, and where the CPU
    has AMX the scores by its tiles instead of AVX-512 dot products (`/amx`) (--tunings);
  - `host`: logical CPUs, threads per core, NUMA nodes, OpenMP binding variables.

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
from kvtier.kernels.cpu_attention import (  # noqa: E402
    CpuAttentionTuning,
    Prefetch,
    cpu_decode_attention,
)
from kvtier.kernels.cpu_attention_build import CFLAGS, cpu_attention_extension  # noqa: E402

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
DEFAULT_SHAPES = "1x8192,8x4096,32x2048,64x1024"
ROTATE_BYTES = 1 << 30  # at least this many bytes of KV copies cycled through per shape
# heads_per_item / prefetch hint / distance; "-" is the kernel's default choice
DEFAULT_TUNINGS = "-/t0/2,1/t0/2,1/nta/2,-/none/0,-/nta/2,-/nta/8,-/t0/8,-/t2/8"


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


def host_read_gbps(iters: int, threads: int | None = None) -> float:
    """Memory read bandwidth: one pass of sum() over a 2 GiB fp32 tensor (on `threads`)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        x = torch.ones(1 << 29, dtype=torch.float32)
        return x.numel() * 4 / median_s(lambda: x.sum(), iters) / 1e9
    finally:
        torch.set_num_threads(before)


def parse_tuning(spec: str) -> CpuAttentionTuning:
    """'HEADS/HINT/DISTANCE[/SCORES]', HEADS '-' for the kernel's choice, HINT none|nta|t0|t2,
    SCORES amx (AMX tiles, where the CPU has them) or vec (AVX-512 dot products, the default)."""
    heads, hint, dist, *scores = spec.split("/")
    if scores not in ([], ["amx"], ["vec"]):
        raise ValueError(f"tuning {spec!r}: the fourth field is 'amx' or 'vec'")
    return CpuAttentionTuning(heads_per_item=None if heads == "-" else int(heads),
                              prefetch=Prefetch[hint.upper()], prefetch_tiles=int(dist),
                              amx=scores == ["amx"])


def topology() -> dict[str, Any]:
    """Threads per core and NUMA nodes as the OS reports them (a VM may hide both)."""
    def read(path: str) -> str | None:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return None
    siblings = read("/sys/devices/system/cpu/cpu0/topology/thread_siblings_list")
    nodes = sorted(p.name for p in Path("/sys/devices/system/node").glob("node[0-9]*"))
    return {"cpu0_thread_siblings": siblings, "numa_nodes": nodes,
            "numa_node0_cpus": read("/sys/devices/system/node/node0/cpulist")}


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


def bench_shape(batch: int, ctx: int, args: argparse.Namespace,
                sweeps: bool) -> dict[str, Any]:
    gen = torch.Generator().manual_seed(batch * 100003 + ctx)
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * 2
    copies = max(1, min(32, -(-ROTATE_BYTES // kv_bytes)))
    first = make_layer(batch, ctx, gen)  # the copies differ in address only: randn is slow
    layers = [first] + [{name: t.clone() for name, t in first.items()} for _ in range(copies - 1)]
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    lens = torch.full((batch,), ctx, dtype=torch.int32)
    out = torch.empty(batch, NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    it = iter(range(1 << 62))

    def gbps(threads: int, tuning: CpuAttentionTuning = CpuAttentionTuning()) -> float:
        def kernel() -> None:
            layer = layers[next(it) % copies]
            cpu_decode_attention(q, layer["k"], layer["v"], layer["tables"], lens, out=out,
                                 num_threads=threads, pages_per_split=args.pages_per_split,
                                 tuning=tuning)
        return round(kv_bytes / median_s(kernel, args.iters) / 1e9, 2)

    row: dict[str, Any] = {"batch": batch, "context": ctx, "kv_bytes": kv_bytes,
                           "copies_cycled": copies}
    row["kernel_gbps"] = gbps(args.threads)
    row["kernel_s"] = kv_bytes / row["kernel_gbps"] / 1e9
    if sweeps:
        row["thread_sweep_gbps"] = {t: gbps(t) for t in args.sweep_threads}
        row["tuning_gbps"] = {spec: gbps(args.threads, parse_tuning(spec))
                              for spec in args.tunings.split(",") if spec}
    if not args.no_sdpa:
        dense = [contiguous_kv(layer, ctx) for layer in layers]
        row.update(sdpa_rows(q, layers[0], lens, dense, it, args))
    return row


def sdpa_rows(q: torch.Tensor, layer: dict[str, torch.Tensor], lens: torch.Tensor,
              dense: list[tuple[torch.Tensor, torch.Tensor]], it: Iterator[int],
              args: argparse.Namespace) -> dict[str, Any]:
    """The kernel checked against SDPA, then SDPA's own GB/s both ways."""
    batch, ctx = q.shape[0], dense[0][0].shape[2]
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * 2
    got = cpu_decode_attention(q, layer["k"], layer["v"], layer["tables"], lens,
                               out_dtype=torch.float32, num_threads=args.threads)[0]
    k0, v0 = dense[0]
    want = F.scaled_dot_product_attention(q.unsqueeze(2).float(), k0.float(), v0.float(),
                                          enable_gqa=True).squeeze(2)
    grouped = F.scaled_dot_product_attention(
        q.float().view(batch, NUM_KV_HEADS, -1, HEAD_DIM), k0.float(), v0.float())
    row: dict[str, Any] = {"max_abs_err_vs_sdpa_fp32": (got - want).abs().max().item(),
                           "sdpa_grouped_vs_gqa_max_abs":
                               (grouped.view_as(want) - want).abs().max().item()}
    assert row["max_abs_err_vs_sdpa_fp32"] < 1e-3 and row["sdpa_grouped_vs_gqa_max_abs"] < 1e-4, row
    for name, run in sdpa_variants(q, dense, it).items():
        row[f"{name}_s"] = median_s(run, args.iters)
        row[f"{name}_gbps"] = round(kv_bytes / row[f"{name}_s"] / 1e9, 2)
    return row


def compute_only(args: argparse.Namespace) -> dict[str, Any]:
    """GB/s (logical KV bytes) over an 8K-token context whose table cycles through a hot set
    of --hot-kib of pages: the kernel's rate from cache, without DRAM."""
    gen = torch.Generator().manual_seed(7)
    page_bytes = 2 * NUM_KV_HEADS * PAGE_SIZE * HEAD_DIM * 2  # K and V of every head
    distinct = max(1, args.hot_kib * 1024 // page_bytes)
    layer = make_layer(1, distinct * PAGE_SIZE, gen)
    ctx = 8192
    tables = layer["tables"].repeat(1, -(-ctx // PAGE_SIZE // distinct))[:, : ctx // PAGE_SIZE]
    q = torch.randn(1, NUM_HEADS, HEAD_DIM, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([ctx], dtype=torch.int32)
    out = torch.empty(1, NUM_HEADS, HEAD_DIM, dtype=torch.bfloat16)
    kv_bytes = 2 * ctx * NUM_KV_HEADS * HEAD_DIM * 2
    res: dict[str, Any] = {"hot_set_bytes": distinct * page_bytes, "context": ctx}
    ext = cpu_attention_extension()
    scores = {"": CpuAttentionTuning()}
    if ext is not None and ext.amx_usable():  # the tiles' scores against the vector ones
        scores["_amx"] = CpuAttentionTuning(amx=True)
    for threads in sorted({1, args.threads}):
        for suffix, tuning in scores.items():
            s = median_s(lambda t=threads, tu=tuning: cpu_decode_attention(
                q, layer["k"], layer["v"], tables.contiguous(), lens, out=out, num_threads=t,
                tuning=tu), args.iters * 3)
            res[f"threads_{threads}{suffix}_gbps"] = round(kv_bytes / s / 1e9, 2)
    return res


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


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="BATCHxCONTEXT,...")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--pages-per-split", type=int, default=None,
                    help="the kernel's split size (default: its own choice)")
    ap.add_argument("--no-sdpa", action="store_true", help="skip the torch SDPA baseline")
    ap.add_argument("--thread-sweep", default="1,4,8,16",
                    help="thread counts of the per-shape sweep (capped at --threads; '' none)")
    ap.add_argument("--tunings", default=DEFAULT_TUNINGS,
                    help="HEADS_PER_ITEM/PREFETCH/DISTANCE,... at --threads ('' none)")
    ap.add_argument("--sweep-shapes", type=int, default=2,
                    help="how many of the shapes (the first ones) get the sweeps")
    ap.add_argument("--hot-kib", type=int, default=256, help="hot set of the compute-only rate")
    ap.add_argument("--clock", choices=("wall", "thread"), default="wall",
                    help="thread: CPU time of the calling thread (needs --threads 1)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    args.sweep_threads = sorted({min(int(t), args.threads)
                                 for t in args.thread_sweep.split(",") if t})
    return args


def main() -> None:
    args = parse_args()
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
    read_by_threads = {t: round(host_read_gbps(args.iters, t), 2) for t in args.sweep_threads}
    print(f"host read {read_gbps:.1f} GB/s ({read_by_threads} by threads), {args.threads} "
          f"threads, kernel isa {ext.isa}, bf16 dot {ext.bf16_dot}, amx {ext.amx_usable()}")
    hot = compute_only(args)
    print(f"compute only (hot set in cache): {hot}")
    rows = []
    for i, shape in enumerate(args.shapes.split(",")):
        batch, ctx = (int(x) for x in shape.lower().split("x"))
        row = bench_shape(batch, ctx, args, sweeps=i < args.sweep_shapes)
        row["kernel_pct_of_host_read"] = round(100 * row["kernel_gbps"] / read_gbps, 1)
        print({k: row[k] for k in row if k.endswith(("gbps", "pct_of_host_read", "context", "batch"))})
        rows.append(row)
    write_result(args.out, {
        "host": {"cpu_model": cpu_name(), "logical_cpus": os.cpu_count(),
                 "flags": cpu_flags_of_interest(), **topology()},
        "threads": args.threads, "clock": args.clock, "kernel_isa": ext.isa,
        "kernel_bf16_dot": ext.bf16_dot, "kernel_amx": ext.amx_usable(),
        "kernel_cflags": list(CFLAGS), "pages_per_split": args.pages_per_split,
        "openmp_env": {k: v for k, v in os.environ.items() if k.startswith(("OMP_", "GOMP_"))},
        "build_or_load_s": round(build_s, 2),
        "host_read_gbps": round(read_gbps, 2), "host_read_gbps_by_threads": read_by_threads,
        "compute_only": hot,
        "geometry": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS, "head_dim": HEAD_DIM,
                     "page_size": PAGE_SIZE, "dtype": "bfloat16"},
        "rows": rows, "elapsed_s": round(time.perf_counter() - t0, 1),
    })


if __name__ == "__main__":
    main()
