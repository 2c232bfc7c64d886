"""The host tier of the prefix cache (its second level, in pinned host memory): full KV
blocks kept in pinned host pages, keyed by the device tier's chained block hashes, loaded
back into fresh device blocks when an admission's device hits end where the host tier's
begin. Pure Python, no tensors: it plans copies as plan items (`HostStore`, `HostLoad`)
that the runner executes (kvtier/offload/) and the cost model prices. It plugs
into the device tier as its `PrefixTier` (kvtier/kv/hooks.py); docs/HOST_TIER.md.

One host page per device block (one layer group of one token block), so a cached token
block is `num_groups` pages, all moved together. The pages have their own pool: the KV
manager's host pool is swap space, owned by requests.

Write policies (SGLang's names), i.e. when a device block gets its host copy:
  * write_through: every block the device tier indexes, in the plan after the one that
    registered it (that plan's step writes its KV: the copy reads it after);
  * write_through_selective: at its `selective_hits`-th device hit (hot prefixes only);
  * write_back: when the device tier evicts it, in the evicting plan, ahead of the reuse.
Under write_through a block evicted before its copy (or whose copy the host tier dropped)
is copied at eviction the same way, so the host tier holds what the device tier lost.

Ordering (why the plan's block ids are safe): the runner issues, on one copy stream in
this order, the plan's swap-outs, its urgent stores (`HostStore`: blocks the device tier
evicts in this plan), then per layer group its host loads and swap-ins, one event per
group the forward waits for, and last the backups (`HostBackup`: write-through copies of
blocks that stay cached, which the forward need not wait for; the next step's copies join
them first) (kvtier/runner/swap_copies.py). So a store reads a device block before any
reuse of it in the plan writes it, and host pages written and read by different plans are
ordered by the stream. Within a plan: pages a load reads are pinned (never evicted for a
store of the same plan: the store would land first); a page evicted after a store into it
takes that store back; a backup's block evicted later in the plan becomes urgent; and a
load stops before a block whose backup is still to be written.

        host LRU (oldest first)      pinned this plan      stores/loads this plan
        index: hash -> pages   --load-->  (skipped by eviction)  --take_items--> plan
                ^   evict oldest, unpinned, when a store finds no free page
"""

from __future__ import annotations

import enum
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvtier.core.items import PlanItem
from kvtier.core.request import Request
from kvtier.kv.block_hash import BlockHash
from kvtier.kv.block_pool import BlockPool
from kvtier.kv.hooks import PrefixTier
from kvtier.kv.host_tier_items import HostBackup, HostLoad, HostPrefetch, HostStore, item_class

if TYPE_CHECKING:
    from kvtier.kv.manager import KVCacheManager

Blocks = tuple[int, ...]  # one id per layer group


class WritePolicy(str, enum.Enum):
    WRITE_THROUGH = "write_through"
    WRITE_THROUGH_SELECTIVE = "write_through_selective"
    WRITE_BACK = "write_back"


@dataclass(frozen=True)
class HostTierConfig:
    num_pages: int  # host pages, one per device block (a token block is num_groups pages)
    write_policy: WritePolicy = WritePolicy.WRITE_THROUGH
    selective_hits: int = 2  # write_through_selective: copied at this many device hits
    min_load_blocks: int = 1  # a host hit of fewer token blocks is computed, not loaded
    direct: bool = False  # the copy engine makes the copies: items of its own kinds

    def __post_init__(self) -> None:
        if self.num_pages < 0 or self.selective_hits < 1 or self.min_load_blocks < 1:
            raise ValueError(f"host tier: num_pages >= 0, selective_hits >= 1, "
                             f"min_load_blocks >= 1, got {self}")


@dataclass
class HostTierStats:
    """Token blocks unless named pages; hits as the admissions that count (a rolled-back
    admission takes its loads back)."""

    hit_blocks: int = 0  # loaded from the host tier on admission
    loads: int = 0  # admissions that loaded
    stored_pages: int = 0
    loaded_pages: int = 0
    evicted_blocks: int = 0  # dropped from the host tier for room
    skipped_stores: int = 0  # no page could be freed (every one pinned, or no pages)
    short_hits_computed: int = 0  # host hits under min_load_blocks, computed instead
    prefetched_blocks: int = 0  # loaded in the background for a request that waits


class HostTier(PrefixTier):
    def __init__(self, config: HostTierConfig, num_groups: int, block_size: int):
        self.config, self.num_groups, self.block_size = config, num_groups, block_size
        self.pool = BlockPool(config.num_pages, "host tier")
        self.index: OrderedDict[BlockHash, Blocks] = OrderedDict()  # pages; LRU first
        self.pinned: set[BlockHash] = set()  # read by a load of the plan being made
        self.device_hits: dict[BlockHash, int] = {}  # write_through_selective's counts
        self._fresh: dict[BlockHash, Blocks] = {}  # registered this plan: copied next plan
        self._ready: dict[BlockHash, Blocks] = {}  # registered last plan: copied this plan
        # This plan's copies: (device blocks, pages); urgent ones (of blocks the device tier
        # evicts in this plan) go before any reuse, the others behind the loads.
        self._stores: dict[BlockHash, tuple[Blocks, Blocks]] = {}
        self._urgent: set[BlockHash] = set()
        self._loads: dict[str, tuple[int, HostLoad]] = {}  # rid -> (first token block, load)
        # Prefetched this plan: indexed by the device tier once the plan is complete (a hit
        # in this plan would read them before they land).
        self._prefetched: list[tuple[BlockHash, Blocks, Blocks]] = []  # (hash, device, pages)
        self.stats = HostTierStats()

    @property
    def num_cached_blocks(self) -> int:
        return len(self.index)

    @property
    def num_planned_load_blocks(self) -> int:
        """Token blocks the plan being made loads so far."""
        return sum(ld.count for _, ld in self._loads.values()) // self.num_groups

    def worth_loading(self, num_blocks: int) -> bool:
        """Whether a host hit of this many token blocks is loaded (else it is computed:
        under the minimum, the load's fixed cost is more than the compute)."""
        return num_blocks >= self.config.min_load_blocks

    def held_run(self, hashes: Sequence[BlockHash]) -> int:
        n, index = 0, self.index
        while n < len(hashes) and hashes[n] in index:
            n += 1
        return n

    # ---- the device tier's events ------------------------------------------------------
    def on_cached(self, h: BlockHash, ids: Blocks, kv: KVCacheManager) -> None:
        if self.config.write_policy is WritePolicy.WRITE_THROUGH and h not in self.index:
            self._fresh[h] = ids

    def on_device_hits(self, hashes: Sequence[BlockHash], blocks: Sequence[Blocks],
                       kv: KVCacheManager) -> None:
        if self.config.write_policy is not WritePolicy.WRITE_THROUGH_SELECTIVE:
            return
        counts, need = self.device_hits, self.config.selective_hits
        for h, ids in zip(hashes, blocks):
            if h in self.index:
                continue
            n = counts[h] = counts.get(h, 0) + 1
            if n >= need:  # written by an earlier plan's step: copied in this one
                del counts[h]
                self._store(h, ids)

    def on_evict(self, h: BlockHash, ids: Blocks, kv: KVCacheManager) -> None:
        self.device_hits.pop(h, None)
        if h in self._stores:  # its blocks may be reused in this plan: copy them first
            self._urgent.add(h)
        waiting = self._fresh.pop(h, None) or self._ready.pop(h, None)
        if h in self.index:
            self.index.move_to_end(h)  # its only copy now: the last to go
        elif (waiting is not None
              or self.config.write_policy is not WritePolicy.WRITE_THROUGH_SELECTIVE):
            self._store(h, ids, urgent=True)  # write_through keeps every evicted block too

    # ---- stores ------------------------------------------------------------------------
    def _store(self, h: BlockHash, ids: Blocks, urgent: bool = False) -> None:
        pages = self._allocate(len(ids))
        if pages is None:
            self.stats.skipped_stores += 1
            return
        self.index[h] = pages
        self._stores[h] = (ids, pages)
        if urgent:
            self._urgent.add(h)

    def _allocate(self, n: int) -> Blocks | None:
        """`n` free pages, evicting the least recently used unpinned blocks; None when even
        that cannot free them (the caller skips its store: a full host tier never fails)."""
        pool = self.pool
        if pool.num_free < n:
            victims: list[BlockHash] = []
            for h in self.index:  # oldest first
                if pool.num_free + len(victims) * self.num_groups >= n:
                    break
                if h not in self.pinned:
                    victims.append(h)
            if pool.num_free + len(victims) * self.num_groups < n:
                return None
            for h in victims:
                self._evict(h)
        return tuple(pool.allocate(n))

    def _evict(self, h: BlockHash) -> None:
        pages = self.index.pop(h)
        self._stores.pop(h, None)  # stored this plan: the page's next writer takes it
        self._urgent.discard(h)
        self.pool.free(list(pages))
        self.stats.evicted_blocks += 1

    # ---- loads -------------------------------------------------------------------------
    def extend(self, req: Request, first: int, hashes: Sequence[BlockHash],
               kv: KVCacheManager) -> list[Blocks]:
        index = self.index
        n = 0
        while n < len(hashes) and self._loadable(hashes[n]):
            n += 1
        if not n:
            return []
        if not self.worth_loading(n):
            self.stats.short_hits_computed += 1
            return []
        g = self.num_groups
        need = n * g
        if kv.num_available_gpu_blocks() < need:
            return []  # computed instead: a partial load would leave a hole to compute
        hit = hashes[:n]
        self.pinned.update(hit)  # before the eviction below: its stores must not take them
        for h in hit:
            index.move_to_end(h)
        ids = kv.allocate_evicting(need)  # group-major, as allocate_slots lays them out
        blocks = [tuple(ids[k * n + j] for k in range(g)) for j in range(n)]
        pages = [index[h] for h in hit]
        load_cls = item_class(HostLoad, self.config.direct)
        self._loads[req.request_id] = (first, load_cls(
            req.request_id, tuple(p[k] for p in pages for k in range(g)),
            tuple(b[k] for b in blocks for k in range(g)), tuple(range(g)) * n))
        self.stats.hit_blocks += n
        self.stats.loads += 1
        return blocks

    def prefetch(self, hashes: Sequence[BlockHash], kv: KVCacheManager, keep: int = 0) -> int:
        """Load the leading run of `hashes` this tier holds into new device blocks, in the
        background of this plan's step, for a request that waits a step (bubble filling:
        the step's forward does not wait for these copies). Returns the token blocks: as
        many of the run as fit beside `keep` evictable device blocks, the last in LRU
        order, that must stay (the request's own device hit)."""
        n, room = 0, (kv.num_available_gpu_blocks() - keep) // self.num_groups
        while n < min(len(hashes), room) and self._loadable(hashes[n]):
            n += 1
        need = n * self.num_groups
        if not n:
            return 0
        hit = hashes[:n]
        self.pinned.update(hit)
        ids = kv.allocate_evicting(need)  # the tier's reference until the device tier adopts them
        g = self.num_groups
        for j, h in enumerate(hit):
            self.index.move_to_end(h)
            self._prefetched.append((h, tuple(ids[j * g:(j + 1) * g]), self.index[h]))
        self.stats.prefetched_blocks += n
        return n

    def _loadable(self, h: BlockHash) -> bool:
        """In this tier and not waiting for its backup (which lands after the loads)."""
        return h in self.index and (h not in self._stores or h in self._urgent)

    def on_finish(self, req: Request, num_tokens: int, kv: KVCacheManager) -> int:
        """An admission rolled back in the plan that made its load: the load goes (its
        blocks are released unfilled with the table), its pages stay cached."""
        taken = self._loads.pop(req.request_id, None)
        if taken is None:
            return num_tokens
        first, load = taken
        self.stats.hit_blocks -= len(load.gpu_blocks) // self.num_groups
        self.stats.loads -= 1
        return min(num_tokens, first * self.block_size)

    # ---- the plan ----------------------------------------------------------------------
    def take_items(self, kv: KVCacheManager) -> list[PlanItem]:
        """This plan's copies: the urgent stores (the runner issues them before any load),
        the backups of blocks that stay cached (behind the loads), one load per admission
        that loads. Write-through copies of the blocks the previous plan registered join
        the backups."""
        for h, ids in self._ready.items():
            if h not in self.index:
                self._store(h, ids)
        self._ready, self._fresh = self._fresh, {}
        items: list[PlanItem] = []
        direct = self.config.direct
        for urgent, cls in ((True, item_class(HostStore, direct)),
                            (False, item_class(HostBackup, direct))):
            pairs = [v for h, v in self._stores.items() if (h in self._urgent) is urgent]
            if pairs:
                items.append(cls(tuple(b for ids, _ in pairs for b in ids),
                                 tuple(p for _, pages in pairs for p in pages)))
                self.stats.stored_pages += items[-1].count
        self._stores, self._urgent = {}, set()
        for _, load in self._loads.values():
            items.append(load)
            self.stats.loaded_pages += load.count
        self._loads = {}
        if self._prefetched:
            items.append(self._adopt_prefetched(kv))
        self.pinned.clear()
        return items

    def _adopt_prefetched(self, kv: KVCacheManager) -> HostPrefetch:
        """The device tier indexes this plan's prefetched blocks (a block it got meanwhile
        from a computing request is freed again: the next step joins the copy first)."""
        pc = kv.prefix_cache
        assert pc is not None
        pages: list[int] = []
        blocks: list[int] = []
        for h, ids, pp in self._prefetched:
            pages += pp
            blocks += ids
            if not pc.adopt(h, ids):
                kv.gpu.free(list(ids))
        self._prefetched = []
        self.stats.loaded_pages += len(blocks)
        cls = item_class(HostPrefetch, self.config.direct)
        return cls(gpu_blocks=tuple(blocks), host_pages=tuple(pages))

    def reset(self, kv: KVCacheManager) -> None:
        """Drop every host copy (the device tier's reset; no request holds blocks)."""
        assert not self._loads and not self._prefetched, "a reset while a plan is made"
        self.pool.free([p for pages in self.index.values() for p in pages])
        self.index.clear()
        self.pinned.clear()
        self.device_hits.clear()
        self._fresh, self._ready, self._stores, self._urgent = {}, {}, {}, set()

    def check_integrity(self, kv: KVCacheManager) -> None:
        """Pages against the pool's counts, the plan's pending copies against the index and
        the device tier's index."""
        owned = [p for pages in self.index.values() for p in pages]
        assert all(len(pages) == self.num_groups for pages in self.index.values())
        self.pool.check_integrity(owned)
        assert self.pinned <= self.index.keys(), "a pinned block left the host tier"
        assert self._urgent <= self._stores.keys()
        for h, (_, pages) in self._stores.items():
            assert self.index.get(h) == pages, "a pending store's pages are not its block's"
        device = kv.prefix_cache.index if kv.prefix_cache is not None else {}
        for waiting in (self._fresh, self._ready):
            for h, ids in waiting.items():
                assert device.get(h) == ids, "a write-through copy waits for an evicted block"
        for rid, (first, load) in self._loads.items():
            table = kv.tables.get(rid)
            assert table is not None, f"{rid}: a pending load without a table"
            n = len(load.gpu_blocks) // self.num_groups
            assert table.num_token_blocks >= first + n
            for i, (b, gr) in enumerate(zip(load.gpu_blocks, load.groups)):
                assert table.block_ids[gr][first + i // self.num_groups] == b, (
                    f"{rid}: a load's target is not its table's block")
        s = self.stats
        assert 0 <= s.hit_blocks and 0 <= s.loads <= s.hit_blocks
