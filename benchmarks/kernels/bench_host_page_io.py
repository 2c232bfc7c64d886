"""Host page I/O microbenchmark (issue 26 item 3): GB/s of moving KV blocks between the
device pool and pinned host pages, against the measured PCIe ceiling, alone and beside a
concurrent 8K-token prefill.

Geometry: a model preset's KV block (default llama-3.1-8b: F=4 layers a block, 8 KV
heads, head_dim 128, bf16), page sizes 1/16/64 tokens. Each transfer moves --volume-mib of
blocks; the block lists are shuffled runs of --run-length consecutive ids on both sides (a
request's blocks come in runs). Variants:
  kernel          host_page_io.gather_to_host / scatter_to_gpu (head-major host pages), one
                  launch a transfer, swept over program counts and tile bytes; ids already on
                  the device (HostPageIO's host-side id checks are not timed)
  direct/block    the copy engine, one cudaMemcpyAsync per block (block-layout host pages),
                  issued through torch's Tensor.copy_
  direct/run      the same, one copy per run of consecutive blocks
  runtime/block   one cudaMemcpyAsync per block, called on the CUDA runtime directly
  batch/block     every block in one cudaMemcpyBatchAsync (CUDA 12.8+)
  batch/run       the same, one piece per run
  ceiling         one 2 GiB pinned copy each way, measured in the same run
Times: median of --reps after --warmup, CUDA events around the issue of a whole transfer (the
direct variants' host issue time included: that is their cost).

Concurrent prefill (--prefill): the engine's own prefill of one --prefill-tokens prompt
(the preset with dummy weights, eager, to its first token; an engine that does not build
stops the run), or with --prefill stand-in a stand-in: the preset's GEMMs (QKV, O, gate_up, down of
every layer, one layer's weights reused) and causal GQA attention (torch SDPA). It runs on the
main stream while a second thread repeats the transfer on a side stream for about as long.
Reported: the prefill's slowdown and the copies' GB/s (the JSON's "prefill" says which ran).

  python -m benchmarks.kernels.bench_host_page_io --out results/kernels/host_page_io_h200.json
                                                                      (H200: a few minutes)
  TRITON_INTERPRET=1 python -m benchmarks.kernels.bench_host_page_io --cpu-smoke --out /tmp/x.json
                                               (CPU: tiny model, the interpreter; logic only)
"""

from __future__ import annotations

import argparse
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from benchmarks.common import time_once, write_result
from benchmarks.kernels.concurrent_prefill import PREFILL_KINDS, make_prefill
from kvtier.bench.gpu_monitor import GpuMonitor, GpuSummary
from kvtier.kernels.host_page_backends import DirectVia, copy_pages_direct
from kvtier.kernels.host_page_io import (
    HostPageLayout,
    gather_to_host,
    gather_to_host_ref,
    host_page_shape,
    scatter_to_gpu,
)
from kvtier.kernels.launch import interpreting

PAGE_TOKENS = (1, 16, 64)
PROGRAMS = (1, 2, 4, 8, 16, 32, 132)
TILE_KIB = (32, 64, 128)
CONCURRENT_PROGRAMS = (1, 2, 4, 8, 16)
TARGET_PCT, TARGET_SLOWDOWN_PCT = 90.0, 5.0
# The copy-engine variants: (one copy per run, how the copies are issued).
DIRECT = {"direct/block": (False, DirectVia.TORCH), "direct/run": (True, DirectVia.TORCH),
          "runtime/block": (False, DirectVia.RUNTIME), "batch/block": (False, DirectVia.BATCH),
          "batch/run": (True, DirectVia.BATCH)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="dummy preset for the geometry")
    p.add_argument("--layers-per-block", type=int, default=4, help="F")
    p.add_argument("--volume-mib", type=float, default=256, help="bytes a transfer moves")
    p.add_argument("--run-length", type=int, default=8, help="consecutive blocks a run")
    p.add_argument("--prefill-tokens", type=int, default=8192)
    p.add_argument("--prefill", choices=PREFILL_KINDS, default="engine",
                   help="the concurrent prefill: the engine's real forward (eager, or "
                        "engine-graphs: its pieces as CUDA graphs, the engine's default), or "
                        "the GEMM+SDPA stand-in (an engine that does not build stops the run)")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--cpu-smoke", action="store_true",
                   help="tiny-llama-gqa on the CPU, fp32, tiny volumes: checks the logic only")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        if not interpreting():
            p.error("--cpu-smoke runs the kernels in Triton's interpreter: set TRITON_INTERPRET=1")
        args.model, args.layers_per_block, args.volume_mib = "tiny-llama-gqa", 2, 1 / 16
        args.prefill_tokens, args.reps, args.warmup = 64, 2, 0
    return args


@dataclass(frozen=True)
class Geometry:
    num_layers: int
    layers_per_block: int
    num_kv_heads: int
    head_dim: int
    num_heads: int
    hidden: int
    intermediate: int
    dtype: torch.dtype

    def block_shape(self, page_tokens: int) -> tuple[int, ...]:
        return (self.layers_per_block, 2, page_tokens, self.num_kv_heads, self.head_dim)

    def block_bytes(self, page_tokens: int) -> int:
        return math.prod(self.block_shape(page_tokens)) * self.dtype.itemsize


def geometry(args: argparse.Namespace, device: torch.device) -> Geometry:
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config(args.model, "dummy")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return Geometry(mc.num_layers, min(args.layers_per_block, mc.num_layers), mc.num_kv_heads,
                    mc.head_dim, mc.num_heads, mc.hidden_size, mc.intermediate_size, dtype)


class Clock:
    """Median seconds of fn(): CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, reps: int, warmup: int):
        self.cuda, self.reps, self.warmup = device.type == "cuda", reps, warmup

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def span(self, fn: Callable[[], object]) -> float:
        self.sync()
        return time_once(fn, self.cuda)

    def median(self, fn: Callable[[], object]) -> float:
        for _ in range(self.warmup):
            fn()
        return statistics.median(self.span(fn) for _ in range(self.reps))


def pcie_ceiling(clock: Clock, device: torch.device, nbytes: int) -> dict[str, float]:
    """GB/s of one large pinned copy each way (the link's ceiling for this run)."""
    pin = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    h2d = clock.median(lambda: dev.copy_(host, non_blocking=True))
    d2h = clock.median(lambda: host.copy_(dev, non_blocking=True))
    return {"bytes": nbytes, "h2d_GBps": nbytes / h2d / 1e9, "d2h_GBps": nbytes / d2h / 1e9}


@dataclass
class Pools:
    page_tokens: int
    gpu_kv: torch.Tensor  # [2n, F, 2, bs, H, D]
    host_head_major: torch.Tensor  # [n, F, 2, H, bs, D] pinned
    host_block: torch.Tensor  # [n, F, 2, bs, H, D] pinned
    gpu_ids: list[int]
    host_ids: list[int]
    gpu_ids_dev: torch.Tensor
    host_ids_dev: torch.Tensor

    @property
    def nbytes(self) -> int:
        return len(self.gpu_ids) * self.gpu_kv[0].numel() * self.gpu_kv.element_size()


def run_ids(num_runs: int, pool_runs: int, run: int, gen: torch.Generator) -> list[int]:
    starts = torch.randperm(pool_runs, generator=gen)[:num_runs] * run
    return (starts[:, None] + torch.arange(run)).flatten().tolist()


def make_pools(g: Geometry, page_tokens: int, args: argparse.Namespace,
               device: torch.device) -> Pools:
    run = args.run_length
    n = max(run, int(args.volume_mib * 2**20) // g.block_bytes(page_tokens) // run * run)
    gen = torch.Generator().manual_seed(page_tokens)
    gpu_ids = run_ids(n // run, 2 * n // run, run, gen)
    host_ids = run_ids(n // run, n // run, run, gen)
    shape = g.block_shape(page_tokens)
    pin = device.type == "cuda"
    gpu_kv = torch.randn(2 * n, *shape, device=device).to(g.dtype)
    pools = [torch.empty(n, *host_page_shape(shape, lay), dtype=g.dtype, pin_memory=pin)
             for lay in HostPageLayout]
    for t in pools:  # random contents, drawn on the device (fast)
        t.copy_(gpu_kv[:n].view(t.shape))
    return Pools(page_tokens, gpu_kv, pools[0], pools[1], gpu_ids, host_ids,
                 torch.tensor(gpu_ids, device=device), torch.tensor(host_ids, device=device))


def transfer(p: Pools, backend: str, to_host: bool, programs: int = 4,
             tile_bytes: int = 64 * 1024) -> Callable[[], None]:
    """One transfer of every listed block, in the named variant."""
    if backend == "kernel":
        hm = HostPageLayout.HEAD_MAJOR
        if to_host:
            return lambda: gather_to_host(p.gpu_kv, p.host_head_major, p.gpu_ids_dev,
                                          p.host_ids_dev, hm, programs, tile_bytes)
        return lambda: scatter_to_gpu(p.host_head_major, p.gpu_kv, p.host_ids_dev,
                                      p.gpu_ids_dev, hm, programs, tile_bytes)
    per_run, via = DIRECT[backend]
    dst, src, dst_ids, src_ids = ((p.host_block, p.gpu_kv, p.host_ids, p.gpu_ids) if to_host
                                  else (p.gpu_kv, p.host_block, p.gpu_ids, p.host_ids))
    if via is not DirectVia.BATCH or p.gpu_kv.device.type != "cuda":
        return lambda: copy_pages_direct(dst, src, dst_ids, src_ids, per_run, via)
    own = torch.cuda.Stream()  # the batch call refuses the legacy default stream

    def batch() -> None:
        caller = torch.cuda.current_stream()
        own.wait_stream(caller)
        with torch.cuda.stream(own):
            copy_pages_direct(dst, src, dst_ids, src_ids, per_run, via)
        caller.wait_stream(own)
    return batch


def kernel_is_correct(p: Pools, clock: Clock) -> bool:
    """One gather through the kernel equals the reference (whole host pool compared)."""
    hm = HostPageLayout.HEAD_MAJOR
    want = p.host_head_major.clone()
    gather_to_host_ref(p.gpu_kv, want, p.gpu_ids_dev, p.host_ids_dev, hm)
    transfer(p, "kernel", to_host=True)()
    clock.sync()
    ok = torch.equal(p.host_head_major, want)
    back = p.gpu_kv.clone()
    back[p.gpu_ids_dev] = 0
    scatter_to_gpu(p.host_head_major, back, p.host_ids_dev, p.gpu_ids_dev, hm)
    clock.sync()
    return ok and torch.equal(back, p.gpu_kv)


def isolated_rows(p: Pools, clock: Clock, pcie: dict[str, float],
                  programs: tuple[int, ...], tiles_kib: tuple[int, ...]) -> list[dict[str, Any]]:
    variants: list[tuple[str, int | None, int | None]] = [
        ("kernel", n, kib) for n in programs for kib in tiles_kib]
    variants += [(name, None, None) for name in DIRECT]
    rows = []
    for to_host in (False, True):
        ceiling = pcie["d2h_GBps" if to_host else "h2d_GBps"]
        for backend, n, kib in variants:
            fn = transfer(p, backend, to_host, n or 1, (kib or 64) * 1024)
            gbps = p.nbytes / clock.median(fn) / 1e9
            rows.append({"page_tokens": p.page_tokens, "direction": "d2h" if to_host else "h2d",
                         "backend": backend, "programs": n, "tile_kib": kib,
                         "blocks": len(p.gpu_ids), "bytes": p.nbytes, "GBps": gbps,
                         "pct_of_pcie": 100 * gbps / ceiling})
    return rows


def issue_on(stream: torch.cuda.Stream, fn: Callable[[], None], repeats: int,
             start: torch.cuda.Event, end: torch.cuda.Event) -> None:
    with torch.cuda.stream(stream):
        start.record()
        for _ in range(repeats):
            fn()
        end.record()


def slowdown_during_copy_pct(alone_s: float, with_s: float, span_s: float) -> float:
    """The prefill's slowdown while the copy ran beside it: both start together, the part of
    the prefill past the copy's end runs at its own speed, so the work done during the copy
    is `alone - (with - overlap)`. Where the copy spans less of the prefill than it, the
    plain slowdown dilutes this."""
    overlap = min(span_s, with_s)
    progress = alone_s - (with_s - overlap)
    return 100 * (overlap / progress - 1) if progress > 0 else math.inf


def board_stats(summary: GpuSummary | None) -> dict[str, float]:
    """Median SM clock and power of the samples (why a compute-bound prefill slows: the
    700 W cap lowers the clock), empty without NVML."""
    if summary is None or not summary.samples:
        return {}
    return {"sm_clock_mhz_median": statistics.median(s.sm_clock_mhz for s in summary.samples),
            "power_w_median": statistics.median(s.power_w for s in summary.samples),
            "board_samples": len(summary.samples)}


def concurrent_row(p: Pools, clock: Clock, prefill: Callable[[], None], prefill_alone_s: float,
                   backend: str, programs: int | None, to_host: bool,
                   fn: Callable[[], None] | None = None,
                   monitor: GpuMonitor | None = None) -> dict[str, Any]:
    """The prefill on the main stream while a second thread issues the transfer, repeated
    for about as long, on a side stream (as a scheduler thread would issue loads): the
    engine's prefill blocks its caller until the token is out, and the direct variants spend
    host time issuing, so neither can wait for the other. `fn`: the transfer, when it is
    not `transfer(p, backend, to_host, programs)`'s. `monitor`: samples the board's clock and
    power over the concurrent runs."""
    fn = fn or transfer(p, backend, to_host, programs or 1)
    one = clock.median(fn)
    repeats = max(1, round(prefill_alone_s / one))
    side = torch.cuda.Stream() if clock.cuda else None
    prefill_s, copy_s = [], []
    if monitor is not None:
        monitor.start()
    for _ in range(max(2, clock.reps - 2)):  # each rep is a whole prefill: fewer of them
        clock.sync()
        if side is None:  # the CPU smoke run: one after the other
            prefill_s.append(clock.span(prefill))
            copy_s.append(clock.span(lambda: [fn() for _ in range(repeats)]))
            continue
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
        thread = threading.Thread(target=issue_on, args=(side, fn, repeats, ev[2], ev[3]))
        ev[0].record()
        thread.start()
        prefill()
        ev[1].record()
        thread.join()
        torch.cuda.synchronize()
        prefill_s.append(ev[0].elapsed_time(ev[1]) / 1e3)
        copy_s.append(ev[2].elapsed_time(ev[3]) / 1e3)
    board = board_stats(monitor.stop() if monitor is not None else None)
    with_s, span = statistics.median(prefill_s), statistics.median(copy_s)
    return {"page_tokens": p.page_tokens, "direction": "d2h" if to_host else "h2d",
            "backend": backend, "programs": programs, "repeats": repeats,
            "prefill_ms_alone": prefill_alone_s * 1e3, "prefill_ms_with": with_s * 1e3,
            "slowdown_pct": 100 * (with_s / prefill_alone_s - 1),
            "copy_GBps": repeats * p.nbytes / span / 1e9,
            "copy_span_over_prefill": span / with_s,
            "slowdown_during_copy_pct": slowdown_during_copy_pct(prefill_alone_s, with_s, span),
            **board}


def summary(rows: list[dict], concurrent: list[dict], pcie: dict[str, float]) -> dict[str, Any]:
    """Against the targets at 16-token pages: the best kernel row each way, the fewest
    programs whose concurrent run keeps both the GB/s and the slowdown targets, and the
    copy-engine variants that keep both beside the prefill."""
    out: dict[str, Any] = {"target_pct_of_pcie": TARGET_PCT,
                           "target_slowdown_pct": TARGET_SLOWDOWN_PCT}
    for d in ("h2d", "d2h"):
        ceiling = pcie[f"{d}_GBps"]
        kernel = [r for r in rows if r["page_tokens"] == 16 and r["direction"] == d
                  and r["backend"] == "kernel"]
        best = max(kernel, key=lambda r: r["GBps"])
        ok = sorted((r for r in concurrent if r["page_tokens"] == 16 and r["direction"] == d
                     and r["backend"] == "kernel"
                     and 100 * r["copy_GBps"] / ceiling >= TARGET_PCT
                     and r["slowdown_pct"] < TARGET_SLOWDOWN_PCT), key=lambda r: r["programs"])
        direct_ok = [r["backend"] for r in concurrent if r["page_tokens"] == 16
                     and r["direction"] == d and r["backend"] in DIRECT
                     and 100 * r["copy_GBps"] / ceiling >= TARGET_PCT
                     and r["slowdown_pct"] < TARGET_SLOWDOWN_PCT]
        out[d] = {"best_isolated": best, "meets_targets_concurrent": bool(ok),
                  "fewest_programs_meeting_targets": ok[0]["programs"] if ok else None,
                  "copy_engine_variants_meeting_targets": direct_ok}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    torch.manual_seed(0)
    g = geometry(args, device)
    clock = Clock(device, args.reps, args.warmup)
    pcie = pcie_ceiling(clock, device, 2**20 if args.cpu_smoke else 2 * 2**30)
    print(f"PCIe ceiling: {pcie['h2d_GBps']:.1f} GB/s H2D, {pcie['d2h_GBps']:.1f} GB/s D2H")
    programs = (1, 2) if args.cpu_smoke else PROGRAMS
    tiles = (1,) if args.cpu_smoke else TILE_KIB
    prefill, prefill_kind = make_prefill(args.prefill, args.model, args.layers_per_block,
                                         args.prefill_tokens, g.dtype, device)
    prefill_alone = clock.median(prefill)
    rows, concurrent, correct = [], [], {}
    for page_tokens in PAGE_TOKENS:
        p = make_pools(g, page_tokens, args, device)
        correct[page_tokens] = kernel_is_correct(p, clock)
        rows += isolated_rows(p, clock, pcie, programs, tiles)
        for to_host in (False, True):
            for backend, n in [*(("kernel", n) for n in CONCURRENT_PROGRAMS[:len(programs)]),
                               *((name, None) for name in DIRECT)]:
                concurrent.append(concurrent_row(p, clock, prefill, prefill_alone, backend, n,
                                                 to_host))
        for r in rows[-2 * (len(programs) * len(tiles) + len(DIRECT)):]:
            print(f"  {page_tokens:>2} tok {r['direction']} {r['backend']:<12} "
                  f"p={r['programs']} tile={r['tile_kib']} KiB: {r['GBps']:6.1f} GB/s "
                  f"({r['pct_of_pcie']:.0f} %)")
        del p
    for r in concurrent:
        print(f"  with prefill: {r['page_tokens']:>2} tok {r['direction']} {r['backend']:<12} "
              f"p={r['programs']}: {r['copy_GBps']:6.1f} GB/s, prefill +{r['slowdown_pct']:.1f} %")
    result = {"geometry": {**vars(g), "dtype": str(g.dtype)}, "args": vars(args), "pcie": pcie,
              "prefill": prefill_kind,
              "prefill_ms_alone": prefill_alone * 1e3, "kernel_correct": correct,
              "isolated": rows, "concurrent": concurrent,
              "summary": summary(rows, concurrent, pcie),
              "wall_s": time.perf_counter() - t_start}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
