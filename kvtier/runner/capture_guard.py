"""CUDA graph capture and Python's cyclic garbage collector.

A collection that runs while a stream captures calls the destructors of whatever dead
objects it finds: an earlier engine's CUDA graphs (`cudaGraphExecDestroy`), its pinned
buffers, events. In the global capture mode `torch.cuda.graph` uses, such a call from any
thread while a stream captures is refused ("operation not permitted when stream is
capturing") and invalidates the capture: its next launch fails (a cuBLAS GEMM reports
CUBLAS_STATUS_EXECUTION_FAILED) and the capture ends in cudaErrorStreamCaptureInvalidated.
`torch.cuda.graph` no longer collects before capturing (only under
`torch.compiler.config.force_cudagraph_gc`), and an engine's objects form reference cycles,
so a dead engine (a test's, a benchmark sweep's) waits for the collector, which runs at
whatever allocation crosses its threshold, inside a capture as likely as not.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """Collect now, before any capture, then keep the cyclic collector off until the block
    ends (reference counting still frees acyclic garbage at once; cycles made meanwhile wait
    for the next collection). Restores the collector's previous state, also on error."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
