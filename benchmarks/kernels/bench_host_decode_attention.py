"""DirectKV's zero-copy decode attention (kvtier/kernels/host_decode_attention.py): GB/s of KV
read from pinned host memory (KV bytes / kernel time) against the PCIe H2D bandwidth measured
in the same run, alone and inside a CUDA graph replay.

Geometry: Llama-3.1-8B's layer (32 query heads, 8 KV heads, head_dim 128, bf16, 16-token
pages), one layer's K and V as views of one pinned pool [pages, 2, Hkv, 16, D] (the host
tier's page-first layout); each request's pages are drawn at random from the pool. Shapes
batch x context from 1 x 4K to 64 x 128K, at most --max-tokens tokens a shape (one pool serves
them all). Per shape:
  default        the wrapper's own launch (tiles, split count from the block table's width)
  splits xF      the split count scaled by F (--split-factors): is the heuristic's fill right?
  launch B/W/S   other tiles: BLOCK_N tokens, warps, stages (--launches)
  graph          the default launch captured once (out / lse / workspace given), replayed
  h2d            one 2 GiB pinned cudaMemcpyAsync (the ceiling), measured before the shapes
Times: CUDA events around EAGER_CALLS back-to-back calls (one replay for the graph), median of
--reps after --warmup. Two shapes are checked
against the torch reference first. Target: the default >= 90 % of the measured H2D.

  python -m benchmarks.kernels.bench_host_decode_attention --out results/kernels/host_decode_attention_h200.json
  TRITON_INTERPRET=1 python -m benchmarks.kernels.bench_host_decode_attention --cpu-smoke --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import median_replay_s, time_once, write_result
from kvtier.kernels.host_decode_attention import (
    HostDecodeLaunch,
    HostDecodeWorkspace,
    choose_num_splits,
    default_launch,
    host_decode_attention,
    host_decode_attention_ref,
)
from kvtier.kernels.launch import interpreting

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, PAGE_SIZE = 32, 8, 128, 16
SHAPES = ("1x4096,1x32768,1x131072,4x32768,8x8192,8x131072,16x4096,16x32768,32x4096,"
          "32x32768,64x4096,64x16384")
LAUNCHES = "32/2/3,64/4/2,128/4/2,128/8/3"
TARGET_PCT = 90.0
EAGER_CALLS = 4  # back-to-back calls a timed eager sample


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES, help="BATCHxCONTEXT,...")
    p.add_argument("--max-tokens", type=int, default=1 << 20, help="pool size in tokens")
    p.add_argument("--split-factors", default="0.5,2,4")
    p.add_argument("--launches", default=LAUNCHES, help="BLOCK_N/WARPS/STAGES,...")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--cpu-smoke", action="store_true",
                   help="the interpreter on CPU tensors, fp32, tiny shapes: the logic only")
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    if args.cpu_smoke:
        if not interpreting():
            p.error("--cpu-smoke runs the kernel in Triton's interpreter: set TRITON_INTERPRET=1")
        args.shapes, args.max_tokens, args.launches = "1x64,2x48", 256, "16/4/1"
        args.split_factors, args.reps, args.warmup = "2", 1, 0
    return args


class Timer:
    """Median seconds of fn(): CUDA events on the GPU, perf_counter on the CPU."""

    def __init__(self, cuda: bool, reps: int, warmup: int):
        self.cuda, self.reps, self.warmup = cuda, reps, warmup

    def once(self, fn: Callable[[], object]) -> float:
        return time_once(fn, self.cuda)

    def median(self, fn: Callable[[], object], inner: int = 1) -> float:
        """Per call: `inner` calls back to back between the events, so the host's launch
        time of one call hides behind the previous one's kernel."""
        for _ in range(self.warmup):
            fn()
        def calls() -> None:
            for _ in range(inner):
                fn()
        return statistics.median(self.once(calls) for _ in range(self.reps)) / inner


def h2d_ceiling(timer: Timer, nbytes: int) -> float:
    """GB/s of one large pinned host-to-device copy."""
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=timer.cuda)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda" if timer.cuda else "cpu")
    return nbytes / timer.median(lambda: dev.copy_(host, non_blocking=True)) / 1e9


def make_pool(num_pages: int, dtype: torch.dtype, cuda: bool) -> torch.Tensor:
    """[num_pages, 2, Hkv, page, D] pinned, random contents drawn on the device in chunks."""
    pool = torch.empty(num_pages, 2, NUM_KV_HEADS, PAGE_SIZE, HEAD_DIM, dtype=dtype,
                       pin_memory=cuda)
    device = "cuda" if cuda else "cpu"
    for lo in range(0, num_pages, 4096):
        chunk = pool[lo : lo + 4096]
        chunk.copy_(torch.randn(chunk.shape, device=device, dtype=torch.float32).to(dtype))
    return pool


def make_problem(pool: torch.Tensor, batch: int, ctx: int, device: torch.device,
                 gen: torch.Generator) -> dict[str, Any]:
    per_req = -(-ctx // PAGE_SIZE)
    ids = torch.randperm(pool.shape[0], generator=gen)[: batch * per_req]
    q = torch.randn(batch, NUM_HEADS, HEAD_DIM, generator=gen).to(pool.dtype)
    return {"q": q.to(device), "k": pool[:, 0], "v": pool[:, 1],
            "tables": ids.to(torch.int32).view(batch, per_req).to(device),
            "lens": torch.full((batch,), ctx, dtype=torch.int32, device=device)}


def call(p: dict[str, Any], **kw: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return host_decode_attention(p["q"], p["k"], p["v"], p["tables"], p["lens"], **kw)


def check_against_reference(p: dict[str, Any]) -> float:
    """Max |out - ref| of the default launch against the torch reference (fp32, host)."""
    out, lse = call(p)
    ref, ref_lse = host_decode_attention_ref(p["q"], p["k"], p["v"], p["tables"], p["lens"])
    err = (out.float() - ref.float()).abs().max().item()
    assert err < 2e-2 and (lse - ref_lse).abs().max().item() < 5e-2, (err, lse, ref_lse)
    return err


def graph_seconds(p: dict[str, Any], reps: int) -> float:
    """Median replay of the default launch captured with its buffers given."""
    q, splits = p["q"], choose_num_splits(p["q"], p["k"], p["tables"].shape[1])
    out, lse = torch.empty_like(q), torch.empty(q.shape[:2], device=q.device)
    ws = HostDecodeWorkspace.allocate(*q.shape[:2], q.shape[2], splits, q.device)
    kw = dict(out=out, lse=lse, num_splits=splits, workspace=ws)
    call(p, **kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(p, **kw)
    for _ in range(2):
        graph.replay()
    return median_replay_s(graph, reps)


def variants(p: dict[str, Any], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Name -> the wrapper's keyword arguments of each timed variant."""
    base = choose_num_splits(p["q"], p["k"], p["tables"].shape[1])
    out: dict[str, dict[str, Any]] = {"default": {}}
    for f in (float(x) for x in args.split_factors.split(",") if x):
        splits = max(1, min(64, round(base * f)))
        if splits != base:
            out[f"splits x{f:g} ({splits})"] = {"num_splits": splits}
    for spec in (s for s in args.launches.split(",") if s):
        bn, nw, ns = (int(x) for x in spec.split("/"))
        launch = HostDecodeLaunch(block_n=bn, num_warps=nw, num_stages=ns)
        out[f"launch {spec}"] = {"launch": launch}
    return out


def bench_shape(p: dict[str, Any], batch: int, ctx: int, timer: Timer, h2d: float,
                args: argparse.Namespace) -> dict[str, Any]:
    kv_bytes = 2 * batch * ctx * NUM_KV_HEADS * HEAD_DIM * p["k"].element_size()
    row: dict[str, Any] = {"batch": batch, "context": ctx, "kv_bytes": kv_bytes,
                           "default_splits": choose_num_splits(p["q"], p["k"],
                                                               p["tables"].shape[1]),
                           "variants": {}}
    for name, kw in variants(p, args).items():
        s = timer.median(lambda kw=kw: call(p, **kw), inner=EAGER_CALLS)
        gbps = kv_bytes / s / 1e9
        row["variants"][name] = {"ms": s * 1e3, "GBps": gbps, "pct_of_h2d": 100 * gbps / h2d}
    if timer.cuda:
        s = graph_seconds(p, args.reps)
        row["graph"] = {"ms": s * 1e3, "GBps": kv_bytes / s / 1e9,
                        "pct_of_h2d": 100 * kv_bytes / s / 1e9 / h2d}
    d = row["variants"]["default"]
    print(f"  {batch:>3} x {ctx:>6}: default {d['GBps']:6.1f} GB/s ({d['pct_of_h2d']:.0f} %), "
          f"best {max(v['GBps'] for v in row['variants'].values()):6.1f}"
          + (f", graph {row['graph']['GBps']:6.1f}" if "graph" in row else ""))
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t0 = time.perf_counter()
    cuda = not args.cpu_smoke
    device = torch.device("cuda" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    timer = Timer(cuda, args.reps, args.warmup)
    h2d = h2d_ceiling(timer, 2 << 30 if cuda else 1 << 20)
    print(f"H2D ceiling {h2d:.1f} GB/s")
    pool = make_pool(args.max_tokens // PAGE_SIZE, dtype, cuda)
    gen = torch.Generator().manual_seed(0)
    shapes = [tuple(int(x) for x in s.lower().split("x")) for s in args.shapes.split(",")]
    errors = {f"{b}x{c}": check_against_reference(make_problem(pool, b, c, device, gen))
              for b, c in (((2, 4096), (1, 1000)) if cuda else ((2, 48), (1, 37)))}
    rows = []
    for batch, ctx in shapes:
        if batch * ctx > args.max_tokens:
            print(f"  {batch} x {ctx}: skipped (over --max-tokens)")
            continue
        rows.append(bench_shape(make_problem(pool, batch, ctx, device, gen), batch, ctx,
                                timer, h2d, args))
    met = [r for r in rows if r["variants"]["default"]["pct_of_h2d"] >= TARGET_PCT]
    result = {"geometry": {"num_heads": NUM_HEADS, "num_kv_heads": NUM_KV_HEADS,
                           "head_dim": HEAD_DIM, "page_size": PAGE_SIZE, "dtype": str(dtype)},
              "args": vars(args), "default_launch": vars(default_launch(dtype)),
              "h2d_GBps": h2d, "max_abs_err_vs_reference": errors, "rows": rows,
              "summary": {"target_pct_of_h2d": TARGET_PCT, "shapes": len(rows),
                          "shapes_meeting_target": len(met)},
              "wall_s": time.perf_counter() - t0}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
