"""The runner's side of the host-resident placement: the host pool seen as pages for the
readers, the moves between the pools (MoveToHost / MoveToDevice), and the step's host rows
handed to attention as external rows (kvtier/attention/base.py, ExternalRows).

Host pages. The runner's pinned host pool holds one [F, 2, block_size, Hkv, D] block per
host block id; a host-running request's blocks store their bytes head-major instead,
[F, 2, Hkv, block_size, D] (HostPageLayout.HEAD_MAJOR), so that each (layer, K/V, KV head)
of a page is one contiguous [block_size, D] tile, what a CPU thread or a zero-copy GPU read
streams. The pool is allocated once; the view costs nothing. Only these systems use the
pool (their preemption recomputes), so no swap copy reads it in the device layout.

    pages[P, F, 2, Hkv, block_size, D];  layer l = g*F + i of host block b:
        K = pages[b, i, 0] (Hkv tiles of block_size x D), V = pages[b, i, 1]

Moves copy with HostPageIO (kvtier/kernels/host_page_backends.py: the UVA kernel on a GPU,
the torch reference on the CPU), converting the layout, on the compute stream before the
forward; then the request's block-table row is rewritten with its new ids.
"""

from __future__ import annotations

import weakref
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kvtier.attention.base import Rope
from kvtier.core.items import PlanItem, group_of
from kvtier.core.plan import ScheduledRequest
from kvtier.kernels.host_page_backends import HostPageIO
from kvtier.policies.host_resident.items import HostRows, MoveToDevice, MoveToHost
from kvtier.runner.host_batch import HostBatch


@dataclass(frozen=True)
class DeviceSuffix:
    """The device-resident part of rows that keep only their oldest blocks on the host
    (partial moves): per layer group, the device blocks after the host prefix and the slot
    of the token the step adds there; a row held wholly on the host has length 0 and
    slot -1."""

    tables: np.ndarray  # [G, n, max_blocks] int32 device block ids
    slots: np.ndarray  # [G, n] int64 (device block * block_size + offset, or -1)
    lens: np.ndarray  # [n] int32, the new token included


@dataclass(frozen=True)
class HostRowsLayout:
    """Where a step's host rows' KV lives: per layer group, their host blocks and the slot
    of the token the step adds (host block * block_size + offset; -1 where the token goes
    to the row's device suffix), and the device suffix when any row has one."""

    num_rows: int
    tables: np.ndarray  # [G, n, max_pages] int32 host block ids
    slots: np.ndarray  # [G, n] int64
    context_lens: np.ndarray  # [n] int32: the host tokens (the new token included if there)
    positions: np.ndarray  # [n] int64
    device: DeviceSuffix | None = None


class HostRowsAttention(ABC):
    """One step's host rows (an ExternalRows): rotates their q and k if asked, then lets
    the system store their new K/V and attend, layer by layer."""

    def __init__(self, num_rows: int, pages: torch.Tensor, layers_per_block: int, ops: Any,
                 layout: HostRowsLayout | None = None):
        self.num_rows, self.pages, self.ops = num_rows, pages, ops
        self.layers_per_block = layers_per_block
        self.layout = layout  # the step's; None for rows a CUDA graph replays

    def forward(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float, out: torch.Tensor, rope: Rope | None) -> None:
        n = self.num_rows
        qn, kn, vn = q[:n], k[:n], v[:n]
        if rope is not None:
            qn, kn = self.ops.rotary(qn, kn, rope.positions[:n], rope.cos_sin_cache)
        group, slot = divmod(layer_idx, self.layers_per_block)
        self.layer(group, slot, qn, kn, vn, scale, out[:n])

    @abstractmethod
    def layer(self, group: int, slot: int, q: torch.Tensor, k: torch.Tensor,
              v: torch.Tensor, scale: float, out: torch.Tensor) -> None:
        """Store k/v ([n, Hkv, D]) at the group's slots of layer `slot`'s pages
        (`self.pages[:, slot]`, [P, 2, Hkv, bs, D]), then write attention of q ([n, Hq, D])
        over the rows' whole context into out (final by `join`)."""

    def join(self, layer_idx: int) -> None:  # noqa: B027 - a hook most systems need not fill
        """The layer's rows are final when `layer` returns, unless a system runs them
        beside the backend's work."""
        return None

    def begin(self) -> None:  # noqa: B027 - only a system working beside a replay needs it
        return None

    def end(self, failed: bool) -> None:  # noqa: B027
        return None


class HostResidentSource(ABC):
    """What a host-resident system attaches to the runner (ExternalAttentionSource)."""

    def __init__(self, runner: Any, rows_item: type[HostRows]):
        self.runner = weakref.proxy(runner)
        self.rows_item = rows_item
        self.io = HostPageIO()  # HEAD_MAJOR pages, the UVA kernel on a GPU
        self._pages: torch.Tensor | None = None

    @property
    def pages(self) -> torch.Tensor:
        """[P, F, 2, Hkv, block_size, D]: the runner's host pool, head-major."""
        host = self.runner.host_kv
        assert host is not None, "allocate_kv first"
        if self._pages is None or self._pages.data_ptr() != host.data_ptr():
            p, f, two, bs, h, d = host.shape
            self._pages = host.view(p, f, two, h, bs, d)
        return self._pages

    # ---- moves (the items' runner hooks) -----------------------------------------------
    def store(self, items: Sequence[MoveToHost]) -> None:
        src = [c.src for it in items for c in it.copies]
        dst = [c.dst for it in items for c in it.copies]
        self.io.store(self.runner.gpu_kv, self.pages, src, dst)
        self._reset_rows(items)

    def load(self, items: Sequence[MoveToDevice]) -> None:
        src = [c.src for it in items for c in it.copies]
        dst = [c.dst for it in items for c in it.copies]
        self.io.load(self.pages, self.runner.gpu_kv, src, dst)
        self._reset_rows(items)

    def _reset_rows(self, items: Sequence[MoveToHost | MoveToDevice]) -> None:
        """The moved requests' block-table rows get their new ids (a request preempted in
        the same step has no row any more: nothing to rewrite)."""
        tables = self.runner.block_tables
        for it in items:
            if it.request_id in tables.row_of:
                tables.apply_ids(it.request_id, it.table, reset=True)

    # ---- a step ------------------------------------------------------------------------
    def for_step(self, scheduled: Sequence[ScheduledRequest], batch: HostBatch,
                 items: Mapping[type[PlanItem], Sequence[PlanItem]]) -> HostRowsAttention | None:
        group = group_of(items, self.rows_item)
        if not group:
            return None
        ids = group[0].request_ids
        n = len(ids)
        if tuple(sr.request_id for sr in scheduled[:n]) != ids or n > batch.num_decodes:
            raise RuntimeError("the host rows must be the step's leading decode rows")
        layout = rows_layout(self.runner.block_tables.table, self.runner.block_size,
                             batch.rows[:n], batch.seq_lens[:n], batch.positions[:n],
                             group[0].host_tokens)
        batch.slots[:, :n] = -1  # the rows' system writes their KV, not the backend
        return self.attention(layout)

    @abstractmethod
    def attention(self, layout: HostRowsLayout) -> HostRowsAttention:
        """The system's attention over this step's host rows."""

    def run_forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                    meta: Any) -> torch.Tensor | None:
        return None  # the runner's forward, with the rows as external rows

    def graph_rows(self, rows: Any) -> HostRowsAttention | None:
        return None  # a system whose attention a CUDA graph can replay says so

    def close(self) -> None:
        return None


def rows_layout(table: np.ndarray, block_size: int, rows: np.ndarray, lens: np.ndarray,
                pos: np.ndarray, host_tokens: Sequence[int]) -> HostRowsLayout:
    """The layout of host rows `rows` of the runner's block table ([G, R, W] int32: host
    ids, then device ids past a row's host prefix); `host_tokens` per row (() : all)."""
    bs, n = block_size, len(rows)
    on_host = np.minimum(lens, np.asarray(host_tokens, dtype=lens.dtype)) if host_tokens \
        else lens
    # C order: fancy indexing leaves [G, n] strided, and the KV write reads a row
    slot = table[:, rows, pos // bs].astype(np.int64) * bs + pos % bs
    host_slots = np.ascontiguousarray(np.where(pos < on_host, slot, -1))
    width = -(-int(on_host.max()) // bs)
    device = None
    dev_lens = (lens - on_host).astype(np.int32)
    if dev_lens.any():
        first = on_host // bs  # a device suffix starts at a block boundary
        dev_width = -(-int(dev_lens.max()) // bs)
        span = np.arange(dev_width)[None, :]
        cols = np.minimum(first[:, None] + span, table.shape[2] - 1)
        # Entries past a row's suffix (all of a row held wholly on the host) are its host
        # ids or padding: block 0 there, so every entry names a device block (a reader may
        # gather whole rows, as the torch reference does).
        past = span >= (-(-dev_lens // bs))[:, None]
        device = DeviceSuffix(
            tables=np.ascontiguousarray(np.where(past, 0, table[:, rows[:, None], cols])),
            slots=np.ascontiguousarray(np.where(pos >= on_host, slot, -1)), lens=dev_lens)
    return HostRowsLayout(num_rows=n, tables=np.ascontiguousarray(table[:, rows, :width]),
                          slots=host_slots, context_lens=on_host.astype(np.int32),
                          positions=pos, device=device)


def source_of(runner: Any) -> HostResidentSource:
    source = runner.external
    if not isinstance(source, HostResidentSource):
        raise RuntimeError("host-resident items need the system's source on the runner")
    return source
