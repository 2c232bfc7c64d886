"""Where the engine's 8K prefill waits while host pages move beside it (the copy engine's
batched copies, or with --variant kernel the Triton I/O kernel).

bench_host_page_io_launch found the copy engine's batched copies (batch/run) costing the
engine's prefill +86 % loading (H2D) and +7 % storing, but +1.3 / +1.6 % beside the GEMM+SDPA
stand-in, which has no copies or host syncs of its own, with the SM clock no lower
(results/kernels/host_page_io_clocks_{engine,stand-in}_h200_6b5d64f.json). So the engine's
step waits on something the copies hold up. This runs one engine prefill alone and one
beside the copies under torch.profiler and writes, for each, the CUDA runtime calls and
torch ops the host spent longest in (a blocking copy, a stream or event sync shows there),
the time from the step's start to its first kernel on the GPU, and the GPU's idle gaps.

  python -m benchmarks.kernels.trace_prefill_beside_copy --out results/kernels/trace_prefill_beside_copy_h200.json
  python -m benchmarks.kernels.trace_prefill_beside_copy --variant kernel --programs 2 --out ...
"""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import write_result
from benchmarks.kernels import bench_host_page_io as io
from benchmarks.kernels.concurrent_prefill import EnginePrefill

TOP = 15
TRACED = "traced_prefill"  # the range around the traced call: it marks the prefill's thread


def _is_gpu(e: Any) -> bool:
    return str(getattr(e, "device_type", "")).endswith("CUDA")


def host_calls(events: list[Any]) -> dict[str, list[dict[str, Any]]]:
    """Per host thread (the prefill's and the copies'), its longest events (runtime calls and
    torch ops, nested ones counted in their parents too), by total time."""
    by_thread: dict[int, dict[str, list[float]]] = {}
    for e in events:
        if not _is_gpu(e):
            names = by_thread.setdefault(int(getattr(e, "thread", 0)), {})
            names.setdefault(e.name, []).append(e.time_range.elapsed_us())
    out = {}
    for tid, totals in by_thread.items():
        ranked = sorted(totals.items(), key=lambda kv: -sum(kv[1]))[:TOP]
        out[str(tid)] = [{"name": n, "calls": len(v), "total_ms": sum(v) / 1e3,
                          "max_ms": max(v) / 1e3} for n, v in ranked]
    return out


def gpu_timeline(events: list[Any]) -> dict[str, Any]:
    """On the GPU (kernels and copies of every stream): the span from the first event to the
    last, and the longest gaps between consecutive events."""
    kernels = sorted((e for e in events if _is_gpu(e)), key=lambda e: e.time_range.start)
    if not kernels:
        return {}
    t0 = kernels[0].time_range.start
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in kernels]
    gaps = sorted(((b[0] - a[1], a[2], b[2]) for a, b in zip(spans, spans[1:])),
                  reverse=True)[:5]
    return {"gpu_events": len(spans), "span_ms": (spans[-1][1] - t0) / 1e3,
            "largest_gaps": [{"us": g, "after": a[:60], "before": b[:60]} for g, a, b in gaps],
            "copies": copy_counts(spans)}


def copy_counts(spans: list[tuple[float, float, str]]) -> dict[str, int]:
    """The GPU's copies and memsets by kind: a pageable upload ("Pageable -> Device") goes
    through the copy engine and queues behind other streams' copies."""
    counts: dict[str, int] = {}
    for _, _, name in spans:
        if name.startswith(("Memcpy", "Memset")):
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


def traced(fn) -> dict[str, Any]:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        with torch.profiler.record_function(TRACED):
            fn()
            torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    events = list(prof.events())
    calls = host_calls(events)
    main = next((tid for tid, rows in calls.items() if any(r["name"] == TRACED for r in rows)),
                None)
    return {"wall_ms": wall * 1e3, "main_thread": main, "host_calls": calls,
            "gpu": gpu_timeline(events)}


def beside_copies(prefill, copy, repeats: int):
    """prefill() on the main stream while a thread issues `repeats` copies on a side stream,
    as bench_host_page_io's concurrent rows run them (`issue_on`)."""
    side = torch.cuda.Stream()

    def run() -> None:
        events = [torch.cuda.Event() for _ in range(2)]
        thread = threading.Thread(target=io.issue_on, args=(side, copy, repeats, *events))
        thread.start()
        prefill()
        thread.join()
    return run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--variant", default="batch/run", choices=sorted([*io.DIRECT, "kernel"]))
    ap.add_argument("--programs", type=int, default=2, help="the kernel variant's programs")
    ap.add_argument("--to-host", action="store_true", help="D2H copies (default H2D)")
    ap.add_argument("--out", required=True)
    own, rest = ap.parse_known_args(argv)
    args = io.parse_args([*rest, "--out", own.out])
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU: the question is how the GPU's queues interact")
    t_start = time.perf_counter()
    device = torch.device("cuda")
    g = io.geometry(args, device)
    clock = io.Clock(device, args.reps, args.warmup)
    prefill = EnginePrefill(args.model, args.layers_per_block, args.prefill_tokens, device)
    prefill_s = clock.median(prefill)
    p = io.make_pools(g, 16, args, device)
    copy = io.transfer(p, own.variant, own.to_host, own.programs)
    one = clock.median(copy)
    repeats = max(1, round(prefill_s / one))
    alone = traced(prefill)
    beside = traced(beside_copies(prefill, copy, repeats))
    for name, t in (("alone", alone), ("beside", beside)):
        for tid, calls in t["host_calls"].items():
            print(f"{name} thread {tid}{' (main)' if tid == t['main_thread'] else ''}: "
                  + ", ".join(f"{c['name']} {c['total_ms']:.1f} ms" for c in calls[:6]))
    result = {"variant": own.variant,
              "programs": own.programs if own.variant == "kernel" else None,
              "direction": "d2h" if own.to_host else "h2d",
              "prefill_ms_median": prefill_s * 1e3, "copy_ms_one": one * 1e3,
              "repeats": repeats, "alone": alone, "beside": beside,
              "wall_s": time.perf_counter() - t_start}
    write_result(own.out, result)
    return result


if __name__ == "__main__":
    main()
