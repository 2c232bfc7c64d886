"""The runner's side of the host tier: its pinned page pool and the step's stores and loads,
moved by the configured io-backend (kvtier/kernels/host_page_backends.py: a Triton kernel
through the pages' UVA address, or the copy engine per block / run of blocks; the torch
reference on the CPU).

The plan items' hooks only stage a step's copies here (`stage`); `SwapCopies.issue`
(kvtier/runner/swap_copies.py) issues them on its copy stream, in its order: swap-outs,
the host stores, then per layer group that group's host loads and swap-ins, one event per
group, and the forward's layers of group g wait for group g's event only (layer-wise
loading: a hit's upper layers cross PCIe while its lower layers compute). On the CPU, and
with overlap off, everything runs in plan order on the current stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvtier.kernels.host_page_backends import HostPageIO, PageIOConfig
from kvtier.kernels.host_page_io import host_page_shape
from kvtier.kv.host_tier_items import HostBackup, HostLoad, HostPrefetch, HostStore
from kvtier.offload.timing import CopyTimer


class HostTierMemoryError(RuntimeError):
    pass


def allocate_pages(num_pages: int, block_shape: tuple[int, ...], dtype: torch.dtype,
                   io: PageIOConfig, pin: bool, option: str) -> torch.Tensor:
    """The host tier's pool, [num_pages, *page shape]: pinned beside a GPU. A pin that fails
    names the option that sized it."""
    shape = (num_pages, *host_page_shape(block_shape, io.layout))
    try:
        return torch.empty(shape, dtype=dtype, pin_memory=pin)
    except RuntimeError as e:  # cudaHostAlloc's failure (too much to lock), or no memory
        gib = num_pages * torch.Size(shape[1:]).numel() * dtype.itemsize / 2**30
        raise HostTierMemoryError(
            f"could not allocate the host tier's {'pinned ' if pin else ''}pool of "
            f"{gib:.1f} GiB ({num_pages} pages): lower {option}") from e


@dataclass
class TransferCounters:
    stored_pages: int = 0
    loaded_pages: int = 0
    store_calls: int = 0
    load_calls: int = 0


class HostTierCopies:
    """Implements `TierCopies` (kvtier/runner/swap_copies.py) for the host tier: urgent
    stores, per-group loads, and in the background the backups and prefetches."""

    def __init__(self, pages: torch.Tensor, io: PageIOConfig, num_groups: int,
                 device: torch.device):
        self.pages, self.io, self.num_groups = pages, HostPageIO(io), num_groups
        self.timer = CopyTimer(device)
        self._stores: tuple[list[int], list[int]] = ([], [])  # (device blocks, pages)
        self._backups: tuple[list[int], list[int]] = ([], [])
        self._prefetch: tuple[list[int], list[int]] = ([], [])  # (pages, device blocks)
        self._loads: list[tuple[list[int], list[int]]] = []  # per group: (pages, blocks)
        self.counters = TransferCounters()

    def stage(self, stores: Sequence[HostStore | HostBackup],
              loads: Sequence[HostLoad | HostPrefetch]) -> None:
        """The step's copies, from its plan items (the items' run hooks)."""
        for s in stores:
            to = self._stores if isinstance(s, HostStore) else self._backups
            to[0].extend(s.gpu_blocks)
            to[1].extend(s.host_pages)
        for ld in loads:
            if isinstance(ld, HostPrefetch):
                self._prefetch[0].extend(ld.host_pages)
                self._prefetch[1].extend(ld.gpu_blocks)
                continue
            if not self._loads:
                self._loads = [([], []) for _ in range(self.num_groups)]
            for p, b, g in zip(ld.host_pages, ld.gpu_blocks, ld.groups):
                self._loads[g][0].append(p)
                self._loads[g][1].append(b)

    def has_work(self) -> bool:
        self.timer.poll()  # once a step: the intervals that have ended since
        return (bool(self._stores[0]) or bool(self._loads) or bool(self._backups[0])
                or bool(self._prefetch[0]))

    def has_loads(self) -> bool:
        return bool(self._loads)

    def issue_stores(self, gpu: torch.Tensor) -> bool:
        blocks, pages = self._stores
        self._stores = ([], [])
        return self._store(gpu, blocks, pages)

    def _store(self, gpu: torch.Tensor, blocks: list[int], pages: list[int]) -> bool:
        if not blocks:
            return False
        self.timer.timed("store_s", lambda: self.io.store(gpu, self.pages, blocks, pages))
        self.counters.stored_pages += len(blocks)
        self.counters.store_calls += 1
        return True

    def _load(self, gpu: torch.Tensor, pages: list[int], blocks: list[int],
              stall: bool) -> bool:
        if not blocks:
            return False
        self.timer.timed("load_s", lambda: self.io.load(self.pages, gpu, pages, blocks,
                                                          awaited=stall), stall)
        self.counters.loaded_pages += len(blocks)
        self.counters.load_calls += 1
        return True

    def issue_background(self, gpu: torch.Tensor) -> None:
        (blocks, pages), self._backups = self._backups, ([], [])
        self._store(gpu, blocks, pages)
        (pages, blocks), self._prefetch = self._prefetch, ([], [])
        self._load(gpu, pages, blocks, stall=False)

    def wait(self, streams: Any, event: Any) -> None:
        """The forward's wait for a layer group's loads, timed as a stall."""
        self.timer.timed_wait(lambda: streams.wait(event))

    def issue_loads(self, gpu: torch.Tensor, group: int) -> bool:
        if not self._loads:
            return False
        pages, blocks = self._loads[group]
        if group == self.num_groups - 1:
            self._loads = []
        return self._load(gpu, pages, blocks, stall=True)
