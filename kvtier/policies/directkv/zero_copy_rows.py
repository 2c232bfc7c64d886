"""DirectKV's host rows as external rows (kvtier/attention/base.py): each layer stores their
new K/V into their host pages through the pages' UVA address (the KV write kernel on a GPU)
and attends over the pages in place (`host_attention`); nothing is staged or swapped in.
A row that keeps only its oldest blocks on the host (partial moves) also has a device
suffix: its new K/V go there, the same kernel attends over the suffix in the device pool,
and the two partial outputs are merged by their log-sum-exp (`merge_attention`, one kernel
on a GPU). The rows write only their own rows of `out`, the backend only the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvtier.kernels.kv_write import kv_write, kv_write_ref
from kvtier.kernels.merge_attention import merge_attention, merge_attention_ref
from kvtier.policies.directkv.host_attention import device_suffix_attention, host_attention
from kvtier.policies.directkv.side_stream import SideStream
from kvtier.policies.host_resident.runner_side import HostRowsAttention, HostRowsLayout


@dataclass(frozen=True)
class SuffixInputs:
    """The device suffix's tables, slots and lengths, on the device (DeviceSuffix's)."""

    tables: torch.Tensor  # [G, n, W'] int32 device block ids
    slots: torch.Tensor  # [G, n] int64, -1 where the new token is on the host
    lens: torch.Tensor  # [n] int32


@dataclass(frozen=True)
class RowInputs:
    """What the host rows' kernels read besides q/k/v and the pages, on their device."""

    tables: torch.Tensor  # [G, n, W] int32 host block ids
    slots: torch.Tensor  # [G, n] int64, each group's row contiguous (the KV write reads one)
    lens: torch.Tensor  # [n] int32, the host tokens
    suffix: SuffixInputs | None = None

    @staticmethod
    def upload(layout: HostRowsLayout, device: torch.device) -> RowInputs:
        def up(a: Any) -> torch.Tensor:
            return torch.from_numpy(a).to(device)
        d = layout.device
        suffix = SuffixInputs(up(d.tables), up(d.slots), up(d.lens)) if d is not None else None
        return RowInputs(up(layout.tables), up(layout.slots), up(layout.context_lens), suffix)


class ZeroCopyRows(HostRowsAttention):
    """A step's host rows (`layout`, uploaded at their first layer) or a decode graph's
    (`inputs` given: views of buffers that stay where they are; graph_rows.py).
    `device_kv`: the runner's device pool, where the rows' device suffixes are."""

    def __init__(self, num_rows: int, pages: torch.Tensor, layers_per_block: int, ops: Any,
                 device: torch.device, side: SideStream | None = None,
                 layout: HostRowsLayout | None = None, inputs: RowInputs | None = None,
                 device_kv: torch.Tensor | None = None):
        super().__init__(num_rows, pages, layers_per_block, ops, layout)
        assert (layout is None) != (inputs is None), "a step's layout or a graph's inputs"
        self.device, self.side, self.device_kv = device, side, device_kv
        self._inputs = inputs

    def inputs(self) -> RowInputs:
        if self._inputs is None:
            assert self.layout is not None
            self._inputs = RowInputs.upload(self.layout, self.device)
        return self._inputs

    def layer(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        if self.side is None:
            self._attend(group, slot, q, k, v, scale, out)
            return
        with self.side.beside_compute(q, k):  # v and out outlive the layer's join
            self._attend(group, slot, q, k, v, scale, out)

    def join(self, layer_idx: int) -> None:
        if self.side is not None:
            self.side.join()

    def _attend(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        inputs = self.inputs()
        pages = self.pages[:, slot]  # [P, 2, Hkv, bs, D]
        write = kv_write if q.is_cuda else kv_write_ref
        write(pages.transpose(2, 3), k, v, inputs.slots[group])  # the KV write's view
        o, lse = host_attention(q, pages[:, 0], pages[:, 1], inputs.tables[group], inputs.lens,
                                scale)
        suffix = inputs.suffix
        if suffix is None:
            out.copy_(o)
            return
        assert self.device_kv is not None, "rows with a device suffix need the device pool"
        blocks = self.device_kv[:, slot]  # [N, 2, bs, Hkv, D]
        write(blocks, k, v, suffix.slots[group])
        o2, lse2 = device_suffix_attention(q, blocks, suffix.tables[group], suffix.lens, scale)
        (merge_attention if q.is_cuda else merge_attention_ref)(o, lse, o2, lse2, out)
