"""What a host-tier copy running beside a forward adds to that forward, per byte it moves,
fit from bench_host_page_io_launch's rows (the engine's 8K prefill alone and beside repeated
16-token-page transfers): the prefill's extra seconds over the bytes the copies moved while
it ran, the mean over the runs given. One figure per io-backend and direction, each the backend's launch as the host tier
makes it (the kernel at its default program count, the copy engine's batch call with a piece
per run). The cost model prices a step's backups and prefetches (the copies no layer waits
for) at these (kvtier/offload/items.py); the hardware profile holds them.

  python -m benchmarks.kernels.fit_beside_forward --out results/calibration/beside_forward_h200.json
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from benchmarks.common import write_result
from kvtier.kernels.host_page_io import DEFAULT_NUM_PROGRAMS, DEFAULT_TILE_BYTES, NUM_WARPS

MEASURED = ["results/kernels/host_page_io_launch_h200_2400594.json",
            "results/kernels/host_page_io_launch_h200_df41f24.json"]
# The host tier's launches: bench_host_page_io_launch's variant names.
VARIANTS = {"kernel": f"p{DEFAULT_NUM_PROGRAMS}w{NUM_WARPS}t{DEFAULT_TILE_BYTES // 1024}",
            "direct": "batch/run"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--measured", nargs="+", default=MEASURED,
                   help="bench_host_page_io_launch's results (the fit: their mean)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def seconds_per_byte(row: dict[str, Any]) -> dict[str, float]:
    """The prefill's extra time over the bytes moved while it ran (the copies' span, capped
    at the prefill's: the transfers repeat for about as long as it)."""
    with_s, alone_s = row["prefill_ms_with"] / 1e3, row["prefill_ms_alone"] / 1e3
    beside_s = min(row["copy_span_over_prefill"], 1.0) * with_s
    moved = row["copy_GBps"] * 1e9 * beside_s
    return {"extra_s": with_s - alone_s, "bytes_beside": moved,
            "s_per_byte": (with_s - alone_s) / moved}


def fit(runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per io-backend and direction: each run's figure and their mean (`s_per_byte`)."""
    tables = [{(r["variant"], r["direction"]): r for r in run["rows"]} for run in runs]
    out: dict[str, dict[str, Any]] = {}
    for backend, variant in VARIANTS.items():
        out[backend] = {"variant": variant}
        for direction in ("h2d", "d2h"):
            each = [seconds_per_byte(rows[(variant, direction)]) for rows in tables]
            out[backend][direction] = {
                "runs": each, "s_per_byte": statistics.fmean(e["s_per_byte"] for e in each)}
    return out


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    runs = []
    for path in args.measured:
        with open(path) as f:
            runs.append(json.load(f))
    fits = fit(runs)
    for backend, f in fits.items():
        print(f"{backend:7s} ({f['variant']}): H2D {f['h2d']['s_per_byte'] * 1e12:.2f} ms/GB, "
              f"D2H {f['d2h']['s_per_byte'] * 1e12:.2f} ms/GB beside the forward")
    write_result(args.out, {"measured": args.measured,
                            "prefill": [run["prefill"] for run in runs],
                            "prefill_ms_alone": [run["prefill_ms_alone"] for run in runs],
                            "io_backends": fits})


if __name__ == "__main__":
    main()
