"""DirectKV's runner side: a host row's new K/V go straight into its host page (the KV
write kernel storing through the page's UVA address on a GPU), and its attention reads the
host pages in place (`host_attention`); nothing is staged, nothing swapped in."""

from __future__ import annotations

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
                 ops: Any, device: torch.device):
        super().__init__(layout, pages, layers_per_block, ops)
        # The step's tables, once on the device for every layer.
        self.tables = torch.from_numpy(layout.tables).to(device)  # [G, n, W] int32
        self.slots = torch.from_numpy(layout.slots).to(device)  # [G, n] int64
        self.lens = torch.from_numpy(layout.context_lens).to(device)  # [n] int32

    def layer(self, group: int, pages: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        block_order = pages.transpose(2, 3)  # [P, 2, bs, Hkv, D]: the KV write's view
        if q.is_cuda:
            kv_write(block_order, k, v, self.slots[group])
        else:
            kv_write_ref(block_order, k, v, self.slots[group])
        o, _ = host_attention(q, pages[:, 0], pages[:, 1], self.tables[group], self.lens,
                              scale)
        out.copy_(o)


class DirectKVSource(HostResidentSource):
    def __init__(self, runner: Any, rows_item: type[HostRows]):
        super().__init__(runner, rows_item)
        self.device = runner.device

    def attention(self, layout: HostRowsLayout) -> ZeroCopyRows:
        r = self.runner
        return ZeroCopyRows(layout, self.pages, r.layers_per_block, r.ops, self.device)
