"""Which of the compute stream's own operations wait for another stream's host-tier copies.

With the step's uploads moved to the UVA copy kernel and sampled batches kept on the device,
the engine's 8K prefill traced beside the copy engine's page loads has no host-to-device copy
of its own left (results/kernels/trace_prefill_beside_copy_h200_b5eb6b4.json) and still takes
~9 % longer; its GPU timeline keeps ~400 device-to-device memcpys and ~250 memsets. If the
copy engine serves those in one queue with the loads, each waits for the loads ahead of it.
This times, on the default stream, device-to-device copies by cudaMemcpyAsync (torch's
copy_ of contiguous tensors), memsets (zero_), the same copies by an SM kernel (copy_bytes)
and by torch's strided copy kernel, a small elementwise kernel, and 64 of them in a row,
launched one by one and replayed as one CUDA graph: alone, and while a side
stream's batched page copy (batch/run, ~5 ms of copying) host to device, then device to
host, was issued a millisecond before it. Each op is timed by CUDA events around it on its
own stream, the stream held by a spin until the op is queued whole, so a wait in the copy
engine's queue, or in fetching the op's commands, shows as time; the host's launch time
does not.

  python -m benchmarks.kernels.probe_copy_engine_share --out results/kernels/copy_engine_share_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import write_result
from benchmarks.kernels import bench_host_page_io as io
from kvtier.kernels.uva_copy import copy_bytes

SIZES = {"64KiB": 64 << 10, "64MiB": 64 << 20}  # a step's small buffer, an 8K prefill's hidden
CHAIN = 64  # kernels in a row: an eager layer's launches, or one replayed graph's
HOST_AHEAD_CYCLES = 1_000_000  # ~0.5 ms of spinning: the host's launches are not timed


def ops(nbytes: int, device: torch.device) -> dict[str, Callable[[], object]]:
    """The compute stream's operations of one size, by name."""
    n = nbytes // 2
    src = torch.randn(n, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    wide = torch.randn(2 * n, device=device).to(torch.bfloat16).view(-1, 2)[:, 0]  # strided
    return {
        "memcpy DtoD (copy_)": lambda: dst.copy_(src),
        "memset (zero_)": lambda: dst.zero_(),
        "kernel copy (copy_bytes)": lambda: copy_bytes(dst, src),
        "strided copy (copy_ kernel)": lambda: dst.copy_(wide),
        "elementwise kernel (add_)": lambda: dst.add_(1),
        f"{CHAIN} elementwise kernels, eager": lambda: chain(dst),
        f"{CHAIN} elementwise kernels, one CUDA graph": graphed(lambda: chain(dst)),
    }


def chain(t: torch.Tensor) -> None:
    for _ in range(CHAIN):
        t.add_(1)


def graphed(fn: Callable[[], object]) -> Callable[[], object]:
    """fn captured once as a CUDA graph; the op is its replay (one launch: the kernels'
    commands are in device memory, not fetched from the host's command buffer one by one)."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def timed_ms(fn: Callable[[], object], reps: int,
             before: Callable[[], None] | None = None) -> float:
    """Median of `reps` event-timed calls on the current stream, each after `before()` (the
    side stream's copy, given a ms to start moving) and each waited for. The stream spins
    before each, so the GPU's time is timed, not the host's launches."""
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        if before is not None:
            before()
            time.sleep(0.001)
        torch.cuda._sleep(HOST_AHEAD_CYCLES)  # the op is queued whole before it starts
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def side_copy(copy: Callable[[], None], side: torch.cuda.Stream) -> Callable[[], None]:
    def issue() -> None:
        with torch.cuda.stream(side):
            copy()
    return issue


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", required=True)
    own, rest = ap.parse_known_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU: the question is how the GPU's engines are shared")
    args = io.parse_args([*rest, "--out", own.out])
    t0 = time.perf_counter()
    device = torch.device("cuda")
    p = io.make_pools(io.geometry(args, device), 16, args, device)
    side = torch.cuda.Stream()
    side_copies = {key: side_copy(io.transfer(p, "batch/run", to_host), side)
                   for key, to_host in (("beside_h2d_ms", False), ("beside_d2h_ms", True))}
    rows = []
    for size, nbytes in SIZES.items():
        for name, fn in ops(nbytes, device).items():
            fn()  # compiles / warms
            row: dict[str, Any] = {"op": name, "size": size,
                                   "alone_ms": timed_ms(fn, own.reps)}
            for key, before in side_copies.items():
                row[key] = timed_ms(fn, own.reps, before)
                row[key.replace("_ms", "_x")] = row[key] / row["alone_ms"]
            torch.cuda.synchronize()
            rows.append(row)
            print(f"{size:>6} {name:<40} alone {row['alone_ms']:.4f} ms, beside H2D "
                  f"{row['beside_h2d_ms']:.4f} ({row['beside_h2d_x']:.1f}x), D2H "
                  f"{row['beside_d2h_ms']:.4f} ({row['beside_d2h_x']:.1f}x)")
    result = {"side_copy": "batch/run", "side_copy_bytes": p.nbytes,
              "side_copy_ms": timed_ms(io.transfer(p, "batch/run", False), 5),
              "reps": own.reps, "rows": rows, "wall_s": time.perf_counter() - t0}
    write_result(own.out, result)
    return result


if __name__ == "__main__":
    main()
