"""NEO's runner side: a host row's attention runs on the CPU, beside the KV it reads. Per
layer the rows' q, k and v cross PCIe to the host (one copy), their new K/V are stored into
the host pages, `cpu_decode_attention` runs on the CPU worker thread (not the Python main
thread: the kernel releases the GIL), and the output crosses back."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from kvtier.attention.base import Rope
from kvtier.core.items import PlanItem, group_of
from kvtier.core.plan import ScheduledRequest
from kvtier.kernels.cpu_attention import CpuAttentionWorker
from kvtier.kernels.cpu_attention_build import cpu_attention_extension
from kvtier.kernels.kv_write import kv_write_ref
from kvtier.policies.host_resident.items import HostRows
from kvtier.policies.host_resident.runner_side import (
    HostResidentSource,
    HostRowsAttention,
    HostRowsLayout,
)


class CpuRows(HostRowsAttention):
    def __init__(self, layout: HostRowsLayout, pages: torch.Tensor, layers_per_block: int,
                 ops: Any, worker: CpuAttentionWorker, num_threads: int | None):
        super().__init__(layout.num_rows, pages, layers_per_block, ops, layout)
        assert layout.device is None, "NEO moves whole requests: no row has a device suffix"
        self.worker, self.num_threads = worker, num_threads
        self.tables = torch.from_numpy(layout.tables)  # [G, n, W] int32 (host)
        self.slots = torch.from_numpy(layout.slots)  # [G, n] int64
        self.lens = torch.from_numpy(layout.context_lens)  # [n] int32

    def layer(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        o, _ = self._submit(group, self.pages[:, slot], q, k, v, scale).result()
        out.copy_(o)

    def submit(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               scale: float, rope: Rope | None) -> Future[tuple[torch.Tensor, torch.Tensor]]:
        """Layer `layer_idx`'s attention for q/k/v of exactly these rows, on the worker;
        returns at once (the pipelined forward runs the other rows meanwhile)."""
        if rope is not None:
            q, k = self.ops.rotary(q, k, rope.positions, rope.cos_sin_cache)
        group, slot = divmod(layer_idx, self.layers_per_block)
        return self._submit(group, self.pages[:, slot], q, k, v, scale)

    def _submit(self, group: int, pages: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                v: torch.Tensor, scale: float) -> Future[tuple[torch.Tensor, torch.Tensor]]:
        hq, hkv = q.shape[1], k.shape[1]
        # One device-to-host copy for the three (it waits for the layer's projection).
        qkv = torch.cat([q, k, v], dim=1).cpu() if q.is_cuda else torch.cat([q, k, v], dim=1)
        qh, kh, vh = qkv.split([hq, hkv, hkv], dim=1)
        kv_write_ref(pages.transpose(2, 3), kh, vh, self.slots[group])
        return self.worker.submit(qh, pages[:, 0], pages[:, 1], self.tables[group],
                                  self.lens, scale, num_threads=self.num_threads)


class NeoSource(HostResidentSource):
    def __init__(self, runner: Any, rows_item: type[HostRows], num_threads: int | None):
        super().__init__(runner, rows_item)
        cpu_attention_extension()  # built (or found cached) at start-up, not in a step
        self.worker = CpuAttentionWorker()
        self.num_threads = num_threads
        self._pipelined: CpuRows | None = None  # this step's rows, when it runs pipelined

    def for_step(self, scheduled: Sequence[ScheduledRequest], batch: Any,
                 items: Mapping[type[PlanItem], Sequence[PlanItem]]) -> HostRowsAttention | None:
        rows = super().for_step(scheduled, batch, items)
        self._pipelined = None
        if isinstance(rows, CpuRows) and getattr(group_of(items, self.rows_item)[0],
                                                 "pipelined", False):
            self._pipelined = rows
        return rows

    def attention(self, layout: HostRowsLayout) -> CpuRows:
        r = self.runner
        return CpuRows(layout, self.pages, r.layers_per_block, r.ops, self.worker,
                       self.num_threads)

    def run_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    meta: Any) -> torch.Tensor | None:
        """The pipelined forward when the plan chose it for this step (neo/pipeline.py)."""
        rows, self._pipelined = self._pipelined, None
        if rows is None:
            return None
        from kvtier.policies.neo.pipelined import pipelined_forward

        return pipelined_forward(self.runner, rows, input_ids, positions, meta)

    def close(self) -> None:
        self.worker.close()
