"""Does a small non-blocking upload from pageable (numpy) memory wait for the GPU?

The step's inputs go up as `torch.from_numpy(a).to(device, non_blocking=True)`. If the
driver synchronizes with the stream before staging a pageable copy, the host's input
preparation for step N+1 cannot run ahead of step N's kernels and async scheduling
overlaps less than it should. Timed on the host while a ~50 ms sleep kernel occupies the
stream: pageable vs pinned sources, a few sizes.

    python -m benchmarks.gpu_path.probe_pageable_copy --out results/gpu_path/pageable_copy_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.common import write_result


def host_ms(src_of, n: int, busy_cycles: int, reps: int = 7) -> float:
    """Median host ms of one non-blocking upload issued behind a busy stream."""
    out = []
    for _ in range(reps):
        src = src_of(n)
        torch.cuda.synchronize()
        torch.cuda._sleep(busy_cycles)
        t0 = time.perf_counter()
        src.to("cuda", non_blocking=True)
        out.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return statistics.median(out)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    cycles = int(2e9 * 0.05)  # ~50 ms at ~2 GHz
    torch.cuda._sleep(1000)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    torch.cuda._sleep(cycles)
    torch.cuda.synchronize()
    sleep_ms = (time.perf_counter() - t0) * 1e3
    rows = []
    for n in (256, 4096, 65536):
        pageable = host_ms(lambda k: torch.from_numpy(np.arange(k, dtype=np.int64)), n, cycles)
        pinned = host_ms(lambda k: torch.arange(k, dtype=torch.int64).pin_memory(), n, cycles)
        rows.append({"int64_elements": n, "pageable_host_ms": pageable,
                     "pinned_host_ms": pinned})
        print(rows[-1], flush=True)
    write_result(args.out, {"busy_kernel_ms": sleep_ms, "uploads": rows})


if __name__ == "__main__":
    main()
