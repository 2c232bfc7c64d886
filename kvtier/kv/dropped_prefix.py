"""The KV manager's dropped prefixes (partial caching): a running request's leading
token blocks taken off the device in every layer group and recomputed every step, or, in
the top `prefix_host_groups` groups, kept in the host pool and copied back each step. A
part of KVCacheManager (kvtier/kv/manager.py), kept apart: pure Python like it."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from kvtier.core.plan import BlockCopy
from kvtier.core.request import Request
from kvtier.kv.map_table import Placement

if TYPE_CHECKING:
    from kvtier.kv.block_pool import BlockPool
    from kvtier.kv.hooks import KVCacheHooks
    from kvtier.kv.manager import KVCacheManager
    from kvtier.kv.map_table import MapTable


class DroppedPrefixes:
    """KVCacheManager's methods for dropped prefixes (the state is the manager's)."""

    num_groups: int
    block_size: int
    prefix_host_groups: int
    pending_swap_out: list[BlockCopy]
    num_dropped_token_blocks: int
    tables: dict[str, MapTable]
    gpu: BlockPool
    host: BlockPool
    hooks: list[KVCacheHooks]

    def _device_blocks_left(self, req: Request) -> None:
        raise NotImplementedError

    def num_dropped_tokens(self, req: Request) -> int:
        """Leading tokens whose KV is DROPPED (all layer groups): recomputed each step."""
        table = self.tables.get(req.request_id)
        return table.num_dropped_blocks * self.block_size if table is not None else 0

    def drop_prefix(self, req: Request, num_token_blocks: int) -> int:
        """Take the device KV of the request's first `num_token_blocks` token blocks off the
        device in every layer group (only a prefix: its recomputation needs nothing after
        it): DROPPED, or, in the top `prefix_host_groups` groups, moved to the host pool
        (`pending_swap_out`). Returns the device blocks it released (references: one that
        another request shares stays allocated, `releasable_blocks`); 0, with nothing
        changed, when the host pool cannot take its part."""
        table = self.tables.get(req.request_id)
        if table is None:
            return 0
        start = table.num_dropped_blocks
        end = min(num_token_blocks, table.num_token_blocks)
        first_host = self.num_groups - self.prefix_host_groups
        n_host = max(0, end - start) * self.prefix_host_groups
        if n_host and not self.host.can_allocate(n_host):
            return 0
        host_ids = iter(self.host.allocate(n_host) if n_host else [])
        freed = []
        for g in range(self.num_groups):
            for j in range(start, end):
                assert table.placements[g][j] is Placement.GPU, "only device KV is dropped"
                old = table.block_ids[g][j]
                freed.append(old)
                if g >= first_host:
                    new = next(host_ids)
                    table.block_ids[g][j], table.placements[g][j] = new, Placement.HOST
                    self.pending_swap_out.append(BlockCopy(src=old, dst=new, group=g))
                else:
                    table.block_ids[g][j], table.placements[g][j] = -1, Placement.DROPPED
        table.num_host_groups = self.prefix_host_groups
        table.num_dropped_blocks = max(start, end)
        self.num_dropped_token_blocks += table.num_dropped_blocks - start
        self.gpu.free(freed)
        self._device_blocks_left(req)
        return len(freed)

    def releasable_blocks(self, req: Request, start: int, end: int) -> list[int]:
        """Per token block in [start, end) of the request's table, its device blocks that no
        other table holds: what dropping them frees (or leaves evictable in a cache). A
        block shared with another request frees nothing."""
        table = self.tables[req.request_id]
        out = []
        for j in range(start, min(end, table.num_token_blocks)):
            held = sum(h.holds_entry(req, cast("KVCacheManager", self), j) for h in self.hooks)
            out.append(sum(1 for g in range(self.num_groups)
                           if table.placements[g][j] is Placement.GPU
                           and self.gpu.ref_count(table.block_ids[g][j]) == 1 + held))
        return out

    def prefix_host_blocks(self, req: Request) -> tuple[tuple[int, ...], ...]:
        """Host blocks of the request's dropped prefix, per layer group (empty for the
        groups it recomputes); () when no group of it waits in the host pool."""
        table = self.tables.get(req.request_id)
        if table is None or not table.num_host_groups or not table.num_dropped_blocks:
            return ()
        k, first_host = table.num_dropped_blocks, self.num_groups - table.num_host_groups
        return tuple(tuple(ids[:k]) if g >= first_host else ()
                     for g, ids in enumerate(table.block_ids))

    def take_pending_swap_out(self) -> list[BlockCopy]:
        copies, self.pending_swap_out = self.pending_swap_out, []
        return copies
