"""DirectKV's host rows as external rows (kvtier/attention/base.py): each layer stores their
new K/V into their host pages through the pages' UVA address (the KV write kernel on a GPU)
and attends over the pages in place (`host_attention`); nothing is staged or swapped in.
The rows write only their own rows of `out`, the backend only the others."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kvtier.kernels.kv_write import kv_write, kv_write_ref
from kvtier.policies.directkv.host_attention import host_attention
from kvtier.policies.directkv.side_stream import SideStream
from kvtier.policies.host_resident.runner_side import HostRowsAttention, HostRowsLayout


@dataclass(frozen=True)
class RowInputs:
    """What the host rows' kernels read besides q/k/v and the pages, on their device."""

    tables: torch.Tensor  # [G, n, W] int32 host block ids
    slots: torch.Tensor  # [G, n] int64, each group's row contiguous (the KV write reads one)
    lens: torch.Tensor  # [n] int32, the new token included

    @staticmethod
    def upload(layout: HostRowsLayout, device: torch.device) -> RowInputs:
        def up(a: Any) -> torch.Tensor:
            return torch.from_numpy(a).to(device)
        return RowInputs(up(layout.tables), up(layout.slots), up(layout.context_lens))


class ZeroCopyRows(HostRowsAttention):
    """A step's host rows (`layout`, uploaded at their first layer) or a decode graph's
    (`inputs` given: views of buffers that stay where they are; graph_rows.py)."""

    def __init__(self, num_rows: int, pages: torch.Tensor, layers_per_block: int, ops: Any,
                 device: torch.device, side: SideStream | None = None,
                 layout: HostRowsLayout | None = None, inputs: RowInputs | None = None):
        super().__init__(num_rows, pages, layers_per_block, ops, layout)
        assert (layout is None) != (inputs is None), "a step's layout or a graph's inputs"
        self.device, self.side = device, side
        self._inputs = inputs

    def inputs(self) -> RowInputs:
        if self._inputs is None:
            assert self.layout is not None
            self._inputs = RowInputs.upload(self.layout, self.device)
        return self._inputs

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
        inputs = self.inputs()
        block_order = pages.transpose(2, 3)  # [P, 2, bs, Hkv, D]: the KV write's view
        if q.is_cuda:
            kv_write(block_order, k, v, inputs.slots[group])
        else:
            kv_write_ref(block_order, k, v, inputs.slots[group])
        o, _ = host_attention(q, pages[:, 0], pages[:, 1], inputs.tables[group], inputs.lens,
                              scale)
        out.copy_(o)
