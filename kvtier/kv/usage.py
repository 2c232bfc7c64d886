"""How full the device blocks of some requests are (the bench's and the planner's
occupancy figures): read-only arithmetic over the KV manager's tables."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from kvtier.core.request import Request
from kvtier.kv.map_table import Placement

if TYPE_CHECKING:
    from kvtier.kv.manager import KVCacheManager


def gpu_slot_usage(kv: KVCacheManager, requests: Iterable[Request]) -> tuple[int, int]:
    """(token slots of the device blocks these requests own, of them the ones holding a
    computed token), summed over layer groups. Read-only. `allocated - filled` is the
    internal fragmentation: the unfilled tail of each request's last block (blocks are
    token-granular, so it does not depend on F) and any slots allocated for tokens the
    step has not computed yet. DROPPED, HOST and HIDDEN entries own no device block."""
    allocated = filled = 0
    size = kv.block_size
    for req in requests:
        table = kv.tables.get(req.request_id)
        if table is None:
            continue
        n, k = req.num_computed_tokens, table.num_dropped_blocks
        for ids, pls in zip(table.block_ids, table.placements):
            on_gpu = pls.count(Placement.GPU)
            if on_gpu == len(ids) - k:  # the usual case: a dropped prefix, then the device
                allocated += on_gpu * size
                filled += max(0, min(n, len(ids) * size) - k * size)
                continue
            for j, p in enumerate(pls):
                if p is Placement.GPU:
                    allocated += size
                    filled += max(0, min(size, n - j * size))
    return allocated, filled
