"""A step's CPU attention as one job that follows a replayed CUDA graph layer by layer: the
host's half of the hand-over (csrc/cpu_step_call.h; the GPU's half is
kvtier/kernels/host_handoff.py).

Started before the replay, the job waits on the kernel's native thread for each layer's
ready flag, stores the rows' new K/V into their host pages, attends, writes the layer's
output rows and raises its done flag; the graph's kernels wait for that flag and read the
output back. Every layer has its own q/k/v and output rows in `Handoff`, so nothing is
overwritten while the other side may still read it, and a graph's warm-up run followed by
its first replay (the same step twice, kvtier/runner/cuda_graphs.py) finds the output of
the warm-up in place.

    Handoff.qkv[L, m, Hq + 2 Hkv, D], Handoff.out[L, m, Hq, D] (the pages' dtype, pinned)
    Handoff.flags[2, L] int32 pinned: ready (GPU -> host), done (host -> GPU), per layer
    Handoff.times[L, 2] int64: when the job saw each layer's rows and raised its done flag
        (CLOCK_MONOTONIC ns, time.monotonic_ns()'s clock): the CPU side's time a layer and
        the GPU's between layers, for profiling (`layer_times`)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from kvtier.kernels.cpu_attention_layers import CpuLayerWorker, layer_template
from kvtier.kernels.launch import check

MAX_EPOCH = 1 << 30  # epochs run 1..MAX_EPOCH and wrap; flags compare for equality only


class Handoff:
    """The pinned buffers a step's layers cross through, for up to `max_rows` rows."""

    def __init__(self, num_layers: int, max_rows: int, num_heads: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, pinned: bool):
        w = num_heads + 2 * num_kv_heads
        self.heads = (num_heads, num_kv_heads, num_kv_heads)
        self.qkv = torch.zeros(num_layers, max_rows, w, head_dim, dtype=dtype, pin_memory=pinned)
        self.out = torch.zeros(num_layers, max_rows, num_heads, head_dim, dtype=dtype,
                               pin_memory=pinned)
        self.lse = torch.zeros(max_rows, num_heads, dtype=torch.float32)  # the job's scratch
        self.flags = torch.zeros(2, num_layers, dtype=torch.int32, pin_memory=pinned)
        self.error = torch.zeros(1, dtype=torch.int32, pin_memory=pinned)  # a GPU wait failed
        self.times = torch.zeros(num_layers, 2, dtype=torch.int64)  # the last job's
        self.epoch = 0

    @property
    def num_layers(self) -> int:
        return self.qkv.shape[0]

    def next_epoch(self) -> int:
        self.epoch = self.epoch % MAX_EPOCH + 1
        return self.epoch

    def layer_times(self, start_ns: int) -> dict[str, float]:
        """Seconds of the last finished job, submitted at `start_ns`: `cpu` its layers'
        work (rows seen to done flag raised), `first` until layer 0's rows came, `between`
        from each done flag to the next layer's rows (the GPU's work and the two flags'
        trips across the link)."""
        seen, done = self.times[:, 0].double(), self.times[:, 1].double()
        return {"cpu": float((done - seen).sum()) * 1e-9,
                "first": (float(seen[0]) - start_ns) * 1e-9,
                "between": float((seen[1:] - done[:-1]).sum()) * 1e-9}

    def cancel(self, epoch: int) -> None:
        """A job of `epoch` whose layers will never come stops at its next wait."""
        self.flags[0].fill_(-epoch)


class StepJob:
    def __init__(self, native: Any, ticket: int, keep: tuple[torch.Tensor, ...]):
        self.native, self.ticket, self.keep = native, ticket, keep

    def wait(self) -> None:
        """Returns once every layer has run; raises what the job raised."""
        try:
            self.native.wait(self.ticket)
        finally:
            self.keep = ()


def native_steps(worker: CpuLayerWorker, head_dim: int) -> bool:
    """Whether steps can run as one job here (the kernel built, a head size it takes)."""
    return worker.native_for(head_dim) is not None


def submit_step(worker: CpuLayerWorker, handoff: Handoff, pages: torch.Tensor,
                layers_per_block: int, tables: torch.Tensor, slots: torch.Tensor,
                lens: torch.Tensor, scale: float, num_threads: int, epoch: int,
                timeout_s: float) -> StepJob:
    """Start the step's job for its first n rows (tables [G, n, W] int32, slots [G, n]
    int64, lens [n] int32, all contiguous on the host); pages [P, F, 2, Hkv, bs, D]."""
    ext, native = worker.ext, worker.native
    assert ext is not None and native is not None, "see native_steps"
    n = lens.shape[0]
    check(0 < n <= handoff.qkv.shape[1], lambda: f"{n} rows, room for {handoff.qkv.shape[1]}")
    qh = handoff.qkv[0, :n].split(handoff.heads, dim=1)[0]
    template = layer_template(ext, qh, pages[:, 0], tables, slots, lens, handoff.out[0, :n],
                              handoff.lse[:n], scale, num_threads)
    pointers = layer_pointers(handoff, pages, layers_per_block, tables, slots)
    flags = handoff.flags
    ticket = ext.submit_step(native, template, pointers.ctypes.data, handoff.num_layers,
                             flags[0].data_ptr(), flags[1].data_ptr(), epoch, timeout_s,
                             handoff.times.data_ptr())
    return StepJob(native, ticket, (tables, slots, lens))


def layer_pointers(handoff: Handoff, pages: torch.Tensor, layers_per_block: int,
                   tables: torch.Tensor, slots: torch.Tensor) -> np.ndarray:
    """[L, 9] int64: each layer's LayerPointers (csrc/cpu_layer_call.h), in its order: q,
    K pages, V pages, block table, slots, new K, new V, output, LSE."""
    def address(t: torch.Tensor, index: np.ndarray, dim: int) -> np.ndarray:
        return t.data_ptr() + index * t.stride(dim) * t.element_size()
    layer = np.arange(handoff.num_layers)
    group, slot = np.divmod(layer, layers_per_block)
    hq, hkv, _ = handoff.heads
    row = handoff.qkv.stride(2) * handoff.qkv.element_size()  # one head of D
    q = address(handoff.qkv, layer, 0)
    k_pages = address(pages, slot, 1)
    return np.stack([
        q, k_pages, k_pages + pages.stride(2) * pages.element_size(),
        address(tables, group, 0), address(slots, group, 0),
        q + hq * row, q + (hq + hkv) * row, address(handoff.out, layer, 0),
        np.full_like(layer, handoff.lse.data_ptr()),
    ], axis=1).astype(np.int64)
