"""How many asynchronous CUDA calls the driver queues before the host blocks on the next one.

The engine's 8K prefill traced beside the copy engine's page copies
(results/kernels/trace_prefill_beside_copy_h200_a00d707.json) spent 118 ms in one
cudaLaunchKernel marked "Command Buffer Full": the copies, one command per page, had filled
the queue the driver keeps for work the GPU has not taken yet, and from then on every call of
the process waited for the copies to drain. This measures that queue: a stream is held by a
spinning kernel (nothing queued behind it can run), then calls are issued into it one by one
until one takes longer than `--block-ms`; the number issued before is what fits. Kinds:
cudaMemcpyAsync of a 16-token page (H2D), the same pages in cudaMemcpyBatchAsync calls of
`--batch` pieces, and an empty kernel launch. `cross_stream`: with the side stream's queue
nearly full of copies, how many kernel launches the main stream still takes, which says
whether the queue is the stream's own or shared; `streams_sharing_main`: the same for each
of `--streams` pool streams in turn (CUDA spreads streams over a few hardware connections,
CUDA_DEVICE_MAX_CONNECTIONS of them, and two streams on one connection share its queue).

  python -m benchmarks.kernels.probe_command_queue --out results/kernels/command_queue_h200.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import write_result
from kvtier.kernels import cuda_memcpy as cm

PAGE_BYTES = 32 * 1024  # one layer's 16-token page of the 8B preset's K or V
HOLD_CYCLES = 6_000_000_000  # ~3 s of spinning at the H200's clock: longer than any probe


def issue_until_block(issue: Callable[[int], None], limit: int, block_s: float
                      ) -> dict[str, Any]:
    """issue(i) for i = 0.. until one call takes longer than block_s (or `limit` calls)."""
    times = []
    for i in range(limit):
        t = time.perf_counter()
        issue(i)
        dt = time.perf_counter() - t
        if dt > block_s:
            return {"calls_before_block": i, "blocked_ms": dt * 1e3,
                    "issue_us_median": statistics.median(times) * 1e6 if times else None}
        times.append(dt)
    return {"calls_before_block": None, "issued": limit,
            "issue_us_median": statistics.median(times) * 1e6}


def held(stream: torch.cuda.Stream, probe: Callable[[], dict[str, Any]],
         cycles: int = HOLD_CYCLES) -> dict[str, Any]:
    """probe() while `stream` spins, then wait for everything to drain."""
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)
        out = probe()
    torch.cuda.synchronize()
    return out


def fill_then_main(copy: Callable[[int], None], fits: int, block_s: float,
                   tiny: torch.Tensor) -> dict[str, Any]:
    """9/10 of a held stream's queue filled with copies, then launches on the default stream
    until one blocks (3 x the queue's depth at most: past that it is not the same queue)."""
    queued = int(fits * 0.9)
    for i in range(queued):
        copy(i)
    with torch.cuda.stream(torch.cuda.default_stream()):
        out = issue_until_block(lambda i: tiny.add_(1), 3 * fits, block_s)
    return {**out, "side_copies_queued": queued}


def page_copier(stream: torch.cuda.Stream, host: int, dev: int, pages: int
                ) -> Callable[[int], None]:
    """copy(i): one cudaMemcpyAsync of page i (mod `pages`) host -> device on `stream`."""
    def copy(i: int) -> None:
        off = (i % pages) * PAGE_BYTES
        cm.memcpy_each([dev + off], [host + off], [PAGE_BYTES], stream.cuda_stream)
    return copy


def sharing_main(streams: int, fits: int, host: int, dev: int, pages: int, block_s: float,
                 tiny: torch.Tensor) -> list[int]:
    """Indices (in creation order) of new pool streams whose full queue blocks the default
    stream's launches."""
    shared = []
    for k in range(streams):
        s = torch.cuda.Stream()
        copy = page_copier(s, host, dev, pages)
        r = held(s, lambda c=copy: fill_then_main(c, fits, block_s, tiny), HOLD_CYCLES // 4)
        if r["calls_before_block"] is not None:
            shared.append(k)
    return shared


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=200_000, help="calls at most per kind")
    ap.add_argument("--batch", type=int, default=64, help="pieces a cudaMemcpyBatchAsync call")
    ap.add_argument("--block-ms", type=float, default=20.0)
    ap.add_argument("--streams", type=int, default=16, help="pool streams checked for sharing")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("needs a GPU: the queue is the CUDA driver's")
    pages = 4096
    host = torch.empty(pages * PAGE_BYTES, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(pages * PAGE_BYTES, dtype=torch.uint8, device="cuda")
    h, d, block_s = host.data_ptr(), dev.data_ptr(), args.block_ms / 1e3
    side, idx = torch.cuda.Stream(), torch.cuda.current_device()
    tiny = torch.zeros(1, device="cuda")
    tiny.add_(1)  # its kernel's module loaded now: a first launch may wait for the device
    torch.cuda.synchronize()

    one_copy = page_copier(side, h, d, pages)

    def batch_copy(i: int) -> None:
        offs = [((i * args.batch + j) % pages) * PAGE_BYTES for j in range(args.batch)]
        cm.memcpy_batch([d + o for o in offs], [h + o for o in offs],
                        [PAGE_BYTES] * args.batch, side.cuda_stream, False, idx)

    rows: dict[str, Any] = {
        "memcpy_async": held(side, lambda: issue_until_block(one_copy, args.limit, block_s)),
        "kernel_launch": held(side, lambda: issue_until_block(lambda i: tiny.add_(1),
                                                              args.limit, block_s))}
    if cm.has_batch():
        rows["memcpy_batch"] = held(side, lambda: issue_until_block(
            batch_copy, max(1, args.limit // args.batch), block_s))
        rows["memcpy_batch"]["pieces_a_call"] = args.batch
    fits = rows["memcpy_async"]["calls_before_block"]
    if fits:
        rows["cross_stream"] = held(side, lambda: fill_then_main(one_copy, fits, block_s, tiny))
        rows["streams_sharing_main"] = sharing_main(args.streams, fits, h, d, pages, block_s, tiny)
    for kind, r in rows.items():
        print(f"{kind}: {r}")
    result = {"page_bytes": PAGE_BYTES, "args": vars(args), "rows": rows}
    write_result(args.out, result)
    return result


if __name__ == "__main__":
    main()
