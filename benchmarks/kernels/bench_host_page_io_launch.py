"""How the host page I/O kernel's launch shape sets its cost to a concurrent prefill (issue
26 item 3's "< 5 % slowdown of a concurrent 8K-token prefill" at >= 90 % of PCIe).

bench_host_page_io measured the kernel's stores (D2H) slowing the prefill far more than its
program count explains, and far more than the copy engine moving the same bytes
(results/kernels/host_page_io_h200_runtime.json). The suspicion: stores the SMs issue to
host memory faster than PCIe drains them back up inside the GPU, where the prefill's own
traffic waits behind them. This sweep tests it at 16-token pages, both directions, each
variant alone and beside the prefill (what it found: docs/RESULTS.md, "The hierarchy's
first kernels"):
  programs x warps   fewer threads a program (fewer stores in flight per SM)
  paced              the programs together issue tiles no faster than a set GB/s
                     (host_page_io's `paced_gbps`: each spins on the GPU's timer)
  tile bytes         smaller bursts between the pacing points
and the copy engine (batch/run) as the reference, all in one process. Where NVML is there the
board's SM clock and power are sampled beside the prefill alone and each concurrent run
(does the copy cost the prefill clock under the power cap?), and each row also gives the
slowdown while the copy ran (`slowdown_during_copy_pct`: the plain slowdown is diluted where the
copy spans less than the prefill). --variants picks rows by name, --prefill stand-in runs the
GEMM+SDPA stand-in (no host-to-device inputs of its own: a copy-engine queue cannot hold it up).

  python -m benchmarks.kernels.bench_host_page_io_launch --out results/kernels/host_page_io_launch_h200.json
  python -m benchmarks.kernels.bench_host_page_io_launch --variants p2w32t64,p4w32t64,p4w32t64@50,batch/run --out ...
  TRITON_INTERPRET=1 python -m benchmarks.kernels.bench_host_page_io_launch --cpu-smoke --out /tmp/x.json
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass
from typing import Any

import torch

from benchmarks.common import write_result
from benchmarks.kernels import bench_host_page_io as io
from benchmarks.kernels.concurrent_prefill import make_prefill
from kvtier.bench.gpu_monitor import GpuMonitor
from kvtier.kernels.host_page_io import HostPageLayout, gather_to_host, scatter_to_gpu

PAGE_TOKENS = 16


@dataclass(frozen=True)
class Launch:
    programs: int
    warps: int = 32
    paced_gbps: float | None = None
    tile_kib: int = 64

    @property
    def name(self) -> str:
        pace = f"@{self.paced_gbps:g}" if self.paced_gbps else ""
        return f"p{self.programs}w{self.warps}t{self.tile_kib}{pace}"


LAUNCHES = (
    *(Launch(p) for p in (1, 2, 4)),  # today's shape (1024 threads a program), unpaced
    *(Launch(p, w) for p, w in ((4, 16), (4, 8), (8, 8), (8, 4), (16, 4))),
    *(Launch(p, 32, r) for p in (4, 8) for r in (40, 45, 50)),
    *(Launch(4, 32, r, 16) for r in (45, 50)),
    *(Launch(p, w, r) for p, w, r in ((8, 8, 45), (8, 8, 50), (16, 4, 50))),
)


def kernel_transfer(p: io.Pools, launch: Launch, to_host: bool):
    hm, tile = HostPageLayout.HEAD_MAJOR, launch.tile_kib * 1024
    warps, pace = launch.warps, launch.paced_gbps
    if to_host:
        return lambda: gather_to_host(p.gpu_kv, p.host_head_major, p.gpu_ids_dev,
                                      p.host_ids_dev, hm, launch.programs, tile,
                                      num_warps=warps, paced_gbps=pace)
    return lambda: scatter_to_gpu(p.host_head_major, p.gpu_kv, p.host_ids_dev, p.gpu_ids_dev,
                                  hm, launch.programs, tile, num_warps=warps, paced_gbps=pace)


def rows_for(p: io.Pools, clock: io.Clock, prefill, prefill_alone_s: float,
             pcie: dict[str, float], launches: tuple[Launch, ...], wanted: set[str] | None,
             monitor: GpuMonitor | None) -> list[dict[str, Any]]:
    rows = []
    for to_host in (False, True):
        ceiling = pcie["d2h_GBps" if to_host else "h2d_GBps"]
        variants: list[tuple[str, Launch | None, Any]] = [
            (launch.name, launch, kernel_transfer(p, launch, to_host)) for launch in launches]
        variants.append(("batch/run", None, io.transfer(p, "batch/run", to_host)))
        for name, launch, fn in variants:
            if wanted is not None and name not in wanted:
                continue
            alone = p.nbytes / clock.median(fn) / 1e9
            row = io.concurrent_row(p, clock, prefill, prefill_alone_s,
                                    "kernel" if launch else name,
                                    launch.programs if launch else None, to_host, fn,
                                    monitor)
            row.update(variant=name, launch=asdict(launch) if launch else None,
                       alone_GBps=alone, alone_pct_of_pcie=100 * alone / ceiling,
                       with_prefill_pct_of_pcie=100 * row["copy_GBps"] / ceiling,
                       meets_targets=(100 * row["copy_GBps"] / ceiling >= io.TARGET_PCT
                                      and row["slowdown_pct"] < io.TARGET_SLOWDOWN_PCT))
            rows.append(row)
            print(f"  {row['direction']} {name:<16} alone {alone:5.1f} GB/s, with prefill "
                  f"{row['copy_GBps']:5.1f} GB/s, prefill +{row['slowdown_pct']:.1f} % "
                  f"(+{row['slowdown_during_copy_pct']:.1f} % during the copy)"
                  f"{'  (meets both)' if row['meets_targets'] else ''}")
    return rows


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """bench_host_page_io's options, and --variants (names, comma-separated; default all)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--variants", default=None)
    own, rest = pre.parse_known_args(argv)
    args = io.parse_args(rest)
    args.variants = own.variants
    return args


def prefill_board(monitor: GpuMonitor | None, clock: io.Clock, prefill) -> dict[str, float]:
    """The board's clock and power over the prefill alone (the rows' reference)."""
    if monitor is None:
        return {}
    monitor.start()
    for _ in range(max(2, clock.reps - 2)):
        clock.span(prefill)
    return io.board_stats(monitor.stop())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    t_start = time.perf_counter()
    device = torch.device("cpu" if args.cpu_smoke else "cuda")
    torch.manual_seed(0)
    g = io.geometry(args, device)
    clock = io.Clock(device, args.reps, args.warmup)
    pcie = io.pcie_ceiling(clock, device, 2**20 if args.cpu_smoke else 2 * 2**30)
    prefill, prefill_kind = make_prefill(args.prefill, args.model, args.layers_per_block,
                                         args.prefill_tokens, g.dtype, device)
    prefill_alone = clock.median(prefill)
    p = io.make_pools(g, PAGE_TOKENS, args, device)
    launches = LAUNCHES[:2] if args.cpu_smoke else LAUNCHES
    wanted = set(args.variants.split(",")) if args.variants else None
    unknown = (wanted or set()) - {x.name for x in LAUNCHES} - {"batch/run"}
    if unknown:
        raise SystemExit(f"unknown --variants {sorted(unknown)}: names are "
                         f"{', '.join(x.name for x in LAUNCHES)}, batch/run")
    monitor = GpuMonitor.create(interval_s=0.02) if clock.cuda else None
    board = prefill_board(monitor, clock, prefill)
    if board:
        print(f"prefill alone: SM clock {board['sm_clock_mhz_median']:.0f} MHz, "
              f"{board['power_w_median']:.0f} W")
    rows = rows_for(p, clock, prefill, prefill_alone, pcie, launches, wanted, monitor)
    best = {d: [r["variant"] for r in rows if r["direction"] == d and r["meets_targets"]]
            for d in ("h2d", "d2h")}
    result = {"geometry": {**vars(g), "dtype": str(g.dtype)}, "args": vars(args),
              "page_tokens": PAGE_TOKENS, "pcie": pcie, "prefill": prefill_kind,
              "prefill_ms_alone": prefill_alone * 1e3, "prefill_board_alone": board,
              "rows": rows,
              "variants_meeting_targets": best, "wall_s": time.perf_counter() - t_start}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
