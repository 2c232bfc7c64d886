"""CPU decode attention a layer at a time, as a step with host-resident rows calls it (the
CPU-attention memory system's runner side).

Per layer the step's host rows' q, k and v come to the host in one copy, into a staging
buffer (pinned when they come from a GPU); then one job on the kernel's native thread
(csrc/cpu_worker.h, csrc/cpu_layer_call.h) writes the new K/V rows into their host pages
and attends over the pages, writing the output into a second staging buffer the caller
copies back (non-blocking: the next layer's copy to the host waits for it in stream order).
The Python main thread only hands over pointers and waits without the GIL; the geometry is
checked once a step, not once a layer.

Where the kernel could not be built, or the head size does not suit it, the same two steps
run as `kv_write_ref` and `cpu_decode_attention` (its torch reference) on a Python worker
thread: the path the tests hold the native one to.

    pages[P, F, 2, Hkv, block_size, D]: layer `slot` of host block p is pages[p, slot]
    tables[G, n, W] int32, slots[G, n] int64 (-1: no new token there), lens[n] int32
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol

import torch

from kvtier.kernels.cpu_attention import (
    HEAD_DIM_MULTIPLE,
    CpuAttentionTuning,
    CpuAttentionWorker,
    _check_inputs,
    cpu_decode_attention,
    extension_args,
)
from kvtier.kernels.cpu_attention_build import cpu_attention_extension
from kvtier.kernels.kv_write import kv_write_ref
from kvtier.kernels.launch import check

LAYER_POINTERS = ("q", "k", "v", "block_table", "out", "lse")  # JobThread.submit_layer's

# Cores the layer calls leave to the rest of the process (the Python main thread, CUDA's
# threads, the GPU's stand-in). An OpenMP team with a thread on every core waits at each
# region's barrier for whichever thread the OS has just preempted: on the H200 host 16
# threads were slower a layer than 15 or 14
# (results/policies/neo_step_contention_h200_75f8e2a.json), and inside the engine's graph
# steps 14 threads beat 16 and 8 (results/policies/neo_step_parts_threads_h200_75f8e2a.json).
SPARE_CORES = 2


def default_num_threads() -> int:
    """The layer calls' threads when none are given: torch's, less SPARE_CORES."""
    return max(1, torch.get_num_threads() - SPARE_CORES)


class PendingLayer(Protocol):
    def done(self) -> bool:
        """Whether the layer's job is known to have run (its buffers free for the next
        layer): the native thread's once `result` has returned or raised."""
        ...

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [n, Hq, D], lse [n, Hq] fp32), once the layer's job has run."""
        ...


class CpuLayerWorker:
    """The thread the layer calls run on: the kernel's native thread where the kernel is
    built, a Python thread for the fallback. One per runner; `close` stops both."""

    def __init__(self) -> None:
        self.ext = cpu_attention_extension()
        self.native = self.ext.JobThread() if self.ext is not None else None
        self._python: CpuAttentionWorker | None = None

    def native_for(self, head_dim: int) -> Any:
        """The native thread where the kernel is built and takes this head size, else None
        (the Python fallback)."""
        return self.native if head_dim % HEAD_DIM_MULTIPLE == 0 else None

    @property
    def python(self) -> CpuAttentionWorker:
        if self._python is None:
            self._python = CpuAttentionWorker()
        return self._python

    def close(self) -> None:
        if self.native is not None:
            self.native.close()
        if self._python is not None:
            self._python.close()


class _NativePending:
    def __init__(self, native: Any, ticket: int, out: torch.Tensor, lse: torch.Tensor,
                 keep: tuple[torch.Tensor, ...]):
        self.native, self.ticket, self.out, self.lse = native, ticket, out, lse
        self.keep = keep  # what the job reads, alive until it has run
        self.error: Exception | None = None

    def done(self) -> bool:
        return not self.keep

    def result(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keep:
            try:
                self.native.wait(self.ticket)
            except Exception as e:  # the job's error, raised again to a later caller
                self.error = e
                raise
            finally:
                self.keep = ()
        if self.error is not None:
            raise self.error
        return self.out, self.lse


class StepLayers:
    """One step's host rows, attended a layer at a time (one layer in flight)."""

    def __init__(self, worker: CpuLayerWorker, pages: torch.Tensor, tables: torch.Tensor,
                 slots: torch.Tensor, lens: torch.Tensor, num_heads: int,
                 num_threads: int | None, pinned: bool):
        self.worker, self.pages, self.tables, self.slots, self.lens = (
            worker, pages, tables, slots, lens)
        n, (_, _, _, hkv, _, d) = lens.shape[0], pages.shape
        self.num_threads = default_num_threads() if num_threads is None else num_threads
        self.heads = (num_heads, hkv, hkv)
        self.qkv = torch.empty(n, num_heads + 2 * hkv, d, dtype=pages.dtype, pin_memory=pinned)
        self.out = torch.empty(n, num_heads, d, dtype=pages.dtype, pin_memory=pinned)
        self.lse = torch.empty(n, num_heads, dtype=torch.float32)
        self.native = worker.native_for(d)
        self._templates: dict[float, Any] = {}
        self._pending: PendingLayer | None = None

    def submit(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float) -> PendingLayer:
        """Layer (`group`, `slot`)'s new K/V stored and its attention begun for q/k/v of
        exactly these rows; returns at once."""
        check(q.dtype == self.pages.dtype, lambda: f"q is {q.dtype}, the pages {self.pages.dtype}")
        if self._pending is not None and not self._pending.done():
            raise RuntimeError("one layer at a time: wait for the last one's result first")
        if q.is_cuda:  # one copy down; the wait is the layer's projection's
            self.qkv.copy_(torch.cat([q, k, v], dim=1), non_blocking=True)
            torch.cuda.current_stream(q.device).synchronize()
        else:
            torch.cat([q, k, v], dim=1, out=self.qkv)
        qh, kh, vh = self.qkv.split(self.heads, dim=1)
        pages = self.pages[:, slot]  # [P, 2, Hkv, bs, D]
        if self.native is None:
            kv_write_ref(pages.transpose(2, 3), kh, vh, self.slots[group])
            self._pending = self.worker.python.submit(
                qh, pages[:, 0], pages[:, 1], self.tables[group], self.lens, scale,
                out=self.out, num_threads=self.num_threads)
            return self._pending
        ticket = self.native.submit_layer(
            self._template(float(scale), qh, pages), qh.data_ptr(), pages[:, 0].data_ptr(),
            pages[:, 1].data_ptr(), self.tables[group].data_ptr(), self.slots[group].data_ptr(),
            kh.data_ptr(), vh.data_ptr(), self.out.data_ptr(), self.lse.data_ptr())
        self._pending = _NativePending(self.native, ticket, self.out, self.lse,
                                       (self.qkv, self.pages, self.tables, self.slots,
                                        self.lens))
        return self._pending

    def drain(self) -> None:
        """Wait for the layer in flight, if any: after a step failed, before its buffers go
        and its rows' host pages are released. The layer's own error is not raised here
        (the step's failure is the one to report)."""
        pending = self._pending
        if pending is not None and not pending.done():
            with contextlib.suppress(Exception):
                pending.result()

    def _template(self, scale: float, qh: torch.Tensor, pages: torch.Tensor) -> Any:
        """The step's geometry, checked and handed to the kernel once (per scale)."""
        if scale not in self._templates:
            ext = self.worker.ext
            assert ext is not None, "a native worker comes with the kernel"
            self._templates[scale] = layer_template(
                ext, qh, pages, self.tables, self.slots, self.lens, self.out, self.lse,
                scale, self.num_threads)
        return self._templates[scale]


def layer_template(ext: Any, qh: torch.Tensor, layer_pages: torch.Tensor, tables: torch.Tensor,
                   slots: torch.Tensor, lens: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   scale: float, num_threads: int) -> Any:
    """A step's geometry for the kernel's layer calls, checked once: qh [n, Hq, D] (the new
    K/V rows follow it by q's strides: one staging row holds the three), layer_pages
    [P, 2, Hkv, bs, D] (any layer's), tables [G, n, W], slots [G, n], lens [n], out, lse."""
    kp, vp = layer_pages[:, 0], layer_pages[:, 1]
    _check_inputs(qh, kp, vp, tables[0], lens)
    check(tables.is_contiguous() and slots.is_contiguous(), "tables and slots must be contiguous")
    # The one-call arguments less the pointers each layer gives.
    args = extension_args(qh, kp, vp, tables[0], lens, out, lse, scale, num_threads, None,
                          CpuAttentionTuning())
    for pointer in LAYER_POINTERS:
        del args[pointer]
    return ext.layer_template(**args, q_bf16=qh.dtype == torch.bfloat16,
                              new_stride_b=qh.stride(0), new_stride_h=qh.stride(1))


def reference_layer(pages: torch.Tensor, tables: torch.Tensor, slots: torch.Tensor,
                    lens: torch.Tensor, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
                    v: torch.Tensor, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle of a layer call: the KV write, then the wrapper's attention."""
    layer = pages[:, slot]
    kv_write_ref(layer.transpose(2, 3), k, v, slots[group])
    return cpu_decode_attention(q, layer[:, 0], layer[:, 1], tables[group], lens, scale)
