"""What a cache above the block pools (a prefix cache: blocks kept after their request ends,
shared by later requests) plugs into the KV manager. Pure Python, like the manager.

Contract, per hook (the KV manager calls them, in the order its hooks were added):
  * `on_admit(req, kv)`: a WAITING request is about to be admitted (before its first
    `allocate_slots`). The hook may give it device blocks that already hold the KV of its
    first tokens: append them to its map table (`kv.tables`, creating it) with one more
    reference each (`kv.gpu.incref`), and return how many leading tokens they hold (a
    multiple of `kv.block_size`); the scheduler then starts it at that many computed
    tokens. Return 0 to give nothing. It must not free or move anyone's blocks.
  * `on_finish(req, kv)`: the request ends (finished, aborted or preempted by dropping its
    KV) and its table is about to be released. The hook may keep blocks of it with
    `kv.gpu.incref` (they stay allocated after the request drops its own reference); it
    must not change the table.
  * `on_device_release(req, kv)`: device blocks left the request's table without it ending
    (swapped out, hidden, a dropped prefix); the table already shows their new placement.
    Blocks the hook keeps that no table holds any more may become evictable. It must not
    change the table.
  * `reusable_prefix(req, kv) -> (token blocks, evictable device blocks)`: how many leading
    token blocks of the request's computed tokens, now off the device in its table (hidden),
    the hook still holds on the device with the same content, and how many of those device
    blocks are evictable now (taking them back makes them no room for anyone else).
    Changes nothing.
  * `retake_prefix(req, kv, num_token_blocks)`: put the first `num_token_blocks` of those
    back in the request's table (entries now off the device become GPU entries of the
    hook's blocks, one more reference each, no longer evictable; 0 to take none); the
    table's later entries are the request's own from here on.
  * `holds_entry(req, kv, token_block) -> bool`: whether the hook holds one reference to
    each device block of that token block of the request's table (the manager then tells
    which blocks no other table holds: dropping those frees memory). Changes nothing.
  * `num_evictable_device_blocks()`: device blocks `evict` would free now if asked (the
    manager counts them as room when it decides whether a request can come back).
  * `evict(num_blocks, kv)`: `allocate_slots` is `num_blocks` device blocks short. Release
    (decref) up to that many blocks the hook keeps and no request's table holds; returns how
    many became free. It must not touch blocks a table holds.
  * `owned_device_blocks()`: the device blocks the hook holds a reference to, once per
    reference (`check_integrity` counts them as owners).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from kvtier.core.items import PlanItem
from kvtier.core.request import Request

if TYPE_CHECKING:
    from kvtier.kv.manager import KVCacheManager


class KVCacheHooks:
    """A hook set that does nothing: subclass and override what a cache needs."""

    def on_admit(self, req: Request, kv: KVCacheManager) -> int:
        return 0

    def on_finish(self, req: Request, kv: KVCacheManager) -> None:
        return None

    def on_device_release(self, req: Request, kv: KVCacheManager) -> None:
        return None

    def reusable_prefix(self, req: Request, kv: KVCacheManager) -> tuple[int, int]:
        return 0, 0

    def retake_prefix(self, req: Request, kv: KVCacheManager, num_token_blocks: int) -> None:
        return None

    def holds_entry(self, req: Request, kv: KVCacheManager, token_block: int) -> bool:
        return False

    def num_evictable_device_blocks(self) -> int:
        return 0

    def evict(self, num_blocks: int, kv: KVCacheManager) -> int:
        return 0

    def owned_device_blocks(self) -> Iterable[int]:
        return ()


class PrefixTier:
    """A tier below the device prefix cache (the host tier, kvtier/kv/host_tier.py): the
    `PrefixCache` calls it at these points, with `kv` the KV manager. A cached token block
    is a hash and a tuple of device blocks, one per layer group.

      * `on_cached(h, ids, kv)`: a block entered the device index; its KV is written by a
        step planned now or earlier (the prefix cache's contract), not necessarily run.
      * `on_device_hits(hashes, blocks, kv)`: an admission took these cached blocks.
      * `on_evict(h, ids, kv)`: the block leaves the device index; the device blocks are
        freed right after and may be reused by this very plan, so a copy of them must go in
        this plan, ahead of the reuse.
      * `extend(req, first, hashes, kv)`: an admission's device hits are the request's first
        `first` token blocks; `hashes` are those of the next ones: give the request device
        blocks for the leading run of `hashes` this tier holds, filled by this plan (one
        reference each, the request's), or [].
      * `on_finish(req, num_tokens, kv) -> int`: the request's table is about to be
        released with `num_tokens` computed; return how many of them hold KV (an admission
        rolled back in this plan takes back its loads: their blocks were never filled).
      * `take_items(kv)`: the plan is complete: the tier's copies of it, as plan items.
    """

    def on_cached(self, h: Any, ids: tuple[int, ...], kv: KVCacheManager) -> None:
        return None

    def on_device_hits(self, hashes: Sequence[Any], blocks: Sequence[tuple[int, ...]],
                       kv: KVCacheManager) -> None:
        return None

    def on_evict(self, h: Any, ids: tuple[int, ...], kv: KVCacheManager) -> None:
        return None

    def extend(self, req: Request, first: int, hashes: Sequence[Any],
               kv: KVCacheManager) -> list[tuple[int, ...]]:
        return []

    def held_run(self, hashes: Sequence[Any]) -> int:
        """How many of `hashes`, from the first, this tier holds: a look-up that changes
        nothing (what an admission would find; the scheduler's cache-aware order)."""
        return 0

    def on_finish(self, req: Request, num_tokens: int, kv: KVCacheManager) -> int:
        return num_tokens

    def take_items(self, kv: KVCacheManager) -> list[PlanItem]:
        return []

    def reset(self, kv: KVCacheManager) -> None:
        return None

    def check_integrity(self, kv: KVCacheManager) -> None:
        return None
