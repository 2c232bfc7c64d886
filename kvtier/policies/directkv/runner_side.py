"""DirectKV's runner side: a host row's new K/V go straight into its host page (the KV
write kernel storing through the page's UVA address on a GPU), and its attention reads the
host pages in place (`host_attention`); nothing is staged, nothing swapped in.

On a GPU the host rows run on a side stream (DirectKV's design): per layer it waits for the
compute stream (q, k, v are ready), stores and attends while the backend attends the
device-resident rows on the compute stream, which waits for it at `join` before the layer's
output is read. The rows write only their own rows of `out`, the backend only the others."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from kvtier.kernels.kv_write import kv_write, kv_write_ref
from kvtier.policies.directkv.host_attention import host_attention
from kvtier.policies.host_resident.items import HostRows
from kvtier.policies.host_resident.runner_side import (
    HostResidentSource,
    HostRowsAttention,
    HostRowsLayout,
)


class ZeroCopyRows(HostRowsAttention):
    def __init__(self, layout: HostRowsLayout, pages: torch.Tensor, layers_per_block: int,
                 ops: Any, device: torch.device, side: SideStream | None = None):
        super().__init__(layout, pages, layers_per_block, ops)
        # The step's tables, once on the device for every layer.
        self.tables = torch.from_numpy(layout.tables).to(device)  # [G, n, W] int32
        self.slots = torch.from_numpy(layout.slots).to(device)  # [G, n] int64
        self.lens = torch.from_numpy(layout.context_lens).to(device)  # [n] int32
        self.side = side

    def layer(self, group: int, pages: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        if self.side is None:
            self._attend(group, pages, q, k, v, scale, out)
            return
        with self.side.beside_compute(q, k):  # v and out outlive the layer's join
            self._attend(group, pages, q, k, v, scale, out)

    def join(self, layer_idx: int) -> None:
        if self.side is not None:
            self.side.join()

    def _attend(self, group: int, pages: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        block_order = pages.transpose(2, 3)  # [P, 2, bs, Hkv, D]: the KV write's view
        if q.is_cuda:
            kv_write(block_order, k, v, self.slots[group])
        else:
            kv_write_ref(block_order, k, v, self.slots[group])
        o, _ = host_attention(q, pages[:, 0], pages[:, 1], self.tables[group], self.lens,
                              scale)
        out.copy_(o)


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


class DirectKVSource(HostResidentSource):
    def __init__(self, runner: Any, rows_item: type[HostRows], side_stream: bool = True):
        super().__init__(runner, rows_item)
        self.device = runner.device
        self.side = (SideStream(self.device) if side_stream and self.device.type == "cuda"
                     else None)

    def attention(self, layout: HostRowsLayout) -> ZeroCopyRows:
        r = self.runner
        return ZeroCopyRows(layout, self.pages, r.layers_per_block, r.ops, self.device,
                            self.side)
