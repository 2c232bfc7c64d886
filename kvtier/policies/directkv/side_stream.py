"""A CUDA stream beside the compute stream, for DirectKV's host rows: per layer they wait
for the compute stream (q, k, v are ready), then store and attend while the backend attends
the device-resident rows, and the compute stream waits for them at the layer's join."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch


class SideStream:
    """A CUDA stream beside the compute stream: work issued in `beside_compute` starts after
    what the compute stream has issued so far; `join` makes the compute stream wait for it."""

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)
        self.done = torch.cuda.Event()
        self.pending = False

    @contextlib.contextmanager
    def beside_compute(self, *inputs: torch.Tensor) -> Iterator[None]:
        """`inputs`: compute-stream tensors the work reads that may be freed before the
        layer's join (the hook's rotated q and k are, as soon as it returns): their memory
        is not handed to the compute stream's later allocations before the work is done."""
        compute = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(compute)
        for t in inputs:
            t.record_stream(self.stream)
        with torch.cuda.stream(self.stream):
            yield
        self.done.record(self.stream)
        self.pending = True

    def join(self) -> None:
        if self.pending:
            torch.cuda.current_stream(self.device).wait_event(self.done)
            self.pending = False
