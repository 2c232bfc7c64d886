"""The KV manager: map tables of all requests over a device pool and a host pool.

Pure Python, no tensors: the simulator reuses it unchanged. Contract of every mutating call:
it either succeeds completely or changes nothing (returns None), so the scheduler can try,
preempt, and try again. Blocks are reference-counted (`BlockPool`): a table holds one
reference to each of its blocks, and caches plugged in as `KVCacheHooks` may hold more
(`check_integrity` checks every count against its owners).
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.core.items import PlanItem
from kvtier.core.plan import BlockCopy
from kvtier.core.request import Request
from kvtier.kv.block_pool import BlockPool
from kvtier.kv.dropped_prefix import DroppedPrefixes
from kvtier.kv.hidden_states import HiddenStates
from kvtier.kv.hooks import KVCacheHooks
from kvtier.kv.integrity import check_manager
from kvtier.kv.map_table import MapTable, Placement
from kvtier.kv.prefix_cache import PrefixCache, PrefixCacheConfig
from kvtier.kv.usage import gpu_slot_usage


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager(DroppedPrefixes):
    def __init__(
        self,
        num_groups: int,
        block_size: int,
        num_gpu_blocks: int,
        num_host_blocks: int,
        watermark: float = 0.01,
        hidden_store: HiddenStates | None = None,
        prefix_host_groups: int = 0,
        prefix_cache: PrefixCacheConfig | None = None,
    ):
        """`hidden_store`: what stands in for the KV of HIDDEN entries (hidden states kept
        per token), or None. `prefix_host_groups`: dropped prefixes keep the KV of this many
        top layer groups in the host pool (copied back each step) instead of recomputing
        them. `prefix_cache`: automatic prefix caching of device blocks
        (kvtier/kv/prefix_cache.py), or None."""
        if not 0 <= prefix_host_groups < num_groups:
            raise ValueError(f"prefix_host_groups must be in [0, {num_groups}), "
                             f"got {prefix_host_groups}")
        if prefix_cache is not None and hidden_store is not None \
                and not hidden_store.shares_blocks:
            raise ValueError("prefix caching does not work with this memory system's hidden "
                             "states: they cannot start after a cache hit")
        self.prefix_host_groups = prefix_host_groups
        # Device -> host copies of prefixes offloaded since the last plan (the scheduler
        # moves them into the plan's swap-outs).
        self.pending_swap_out: list[BlockCopy] = []
        self.num_groups, self.block_size = num_groups, block_size
        self.hidden = hidden_store
        self.gpu = BlockPool(num_gpu_blocks, "gpu")
        self.host = BlockPool(num_host_blocks, "host")
        # Admission keeps this many blocks spare so a new request does not force an
        # immediate preemption of the requests already running (vLLM's watermark).
        self.watermark_blocks = int(watermark * num_gpu_blocks)
        self.tables: dict[str, MapTable] = {}
        # Sum of every table's num_dropped_blocks: while it is 0 (no policy dropped a prefix),
        # the scheduler skips asking each request for its dropped prefix.
        self.num_dropped_token_blocks = 0
        # Tokens each request's table holds (token blocks x block_size), for reading only:
        # the scheduler skips allocate_slots for the tokens that already fit.
        self.num_slots: dict[str, int] = {}
        self.no_new_blocks: tuple[tuple[int, ...], ...] = ((),) * num_groups
        self.hooks: list[KVCacheHooks] = []  # caches above the pools (kvtier/kv/hooks.py)
        # Running requests whose KV lives in the host pool (swapped out, yet running), whole
        # or a leading part of it (`swap_out(req, num_token_blocks)`): the table is a host
        # prefix then a device suffix in every group, and new blocks follow its last entry
        # (`grows_on_host`), where their attention reads them.
        self.host_running: set[str] = set()
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache is not None:
            self.prefix_cache = PrefixCache(block_size, num_groups, prefix_cache)
            self.add_hooks(self.prefix_cache)

    def add_hooks(self, hooks: KVCacheHooks) -> None:
        self.hooks.append(hooks)

    # ---- lifecycle hooks (kvtier/kv/hooks.py has their contracts) ------------------------
    def admit(self, req: Request) -> int:
        """Leading tokens of a WAITING request whose KV a hook already holds (now in its
        table); 0 without hooks."""
        cached = 0
        for h in self.hooks:
            cached = cached or h.on_admit(req, self)
        return cached

    def evict(self, num_blocks: int) -> int:
        """Device blocks freed by the hooks' eviction, asked for `num_blocks`."""
        freed = 0
        for h in self.hooks:
            if freed >= num_blocks:
                break
            freed += h.evict(num_blocks - freed, self)
        return freed

    def cache_full_blocks(self, req: Request, num_computed_tokens: int) -> None:
        """Offer the request's blocks filled by its first `num_computed_tokens` tokens, all
        planned, to the prefix cache (its module docstring has the contract)."""
        if self.prefix_cache is not None:
            self.prefix_cache.cache_full_blocks(req, num_computed_tokens, self)

    def take_cache_items(self) -> list[PlanItem]:
        """The plan is complete: the copies the prefix cache's lower tier (the host tier)
        made for it, as plan items ([] without one)."""
        pc = self.prefix_cache
        return pc.lower.take_items(self) if pc is not None and pc.lower is not None else []

    def reset_prefix_cache(self) -> int:
        """Token blocks dropped from the prefix cache (0 without one); raises
        PrefixCacheBusyError, changing nothing, while a request holds KV blocks."""
        return self.prefix_cache.reset(self) if self.prefix_cache is not None else 0

    # ---- device allocation -------------------------------------------------------------
    def blocks_needed(self, req: Request, num_new_tokens: int) -> int:
        table = self.tables.get(req.request_id)
        have = table.num_token_blocks if table else 0
        want = cdiv(req.num_computed_tokens + num_new_tokens, self.block_size)
        return self.num_groups * max(0, want - have)

    def allocate_slots(
        self, req: Request, num_new_tokens: int, use_watermark: bool = False
    ) -> tuple[tuple[int, ...], ...] | None:
        """Blocks for `num_new_tokens` more tokens on the device; the new block ids per group,
        or None (nothing changed) if the pool cannot supply them."""
        table = self.tables.get(req.request_id)
        have = len(table.block_ids[0]) if table is not None else 0
        want = -(-(req.num_computed_tokens + num_new_tokens) // self.block_size)
        if want <= have and table is not None:
            return self.no_new_blocks  # the common decode step: the last block has room
        per_group = max(0, want - have)
        need = per_group * self.num_groups
        pool, placement = self.gpu, Placement.GPU
        reserve = self.watermark_blocks if use_watermark else 0
        if self.host_running and self.grows_on_host(req.request_id):
            pool, placement = self.host, Placement.HOST
            if not pool.can_allocate(need):
                return None
        elif self.gpu.num_free - need < reserve:
            if not self.hooks or self.evict(need + reserve - self.gpu.num_free) <= 0 \
                    or self.gpu.num_free - need < reserve:
                return None
        if table is None:
            table = self.tables[req.request_id] = MapTable(self.num_groups)
        ids = pool.allocate(need)
        new: list[tuple[int, ...]] = []
        for g in range(self.num_groups):
            group_ids = ids[g * per_group : (g + 1) * per_group]
            for b in group_ids:
                table.append(g, b, placement)
            new.append(tuple(group_ids))
        self.num_slots[req.request_id] = want * self.block_size
        return tuple(new)

    def grows_on_host(self, request_id: str) -> bool:
        """A host-running request whose last token block is in the host pool: all of its
        KV is, and its new blocks come from there too."""
        if request_id not in self.host_running:
            return False
        table = self.tables.get(request_id)
        return table is not None and table.placements[0][-1] is Placement.HOST

    def num_host_token_blocks(self, request_id: str) -> int:
        """Leading token blocks (of each group) a host-running request keeps in the host pool
        (past a dropped prefix): its entries there are HOST, then GPU (check_integrity), so
        the first GPU entry ends them, found at C speed (the scheduler asks every step)."""
        table = self.tables.get(request_id)
        if table is None or request_id not in self.host_running:
            return 0
        pls, k = table.placements[0], table.num_dropped_blocks
        try:
            return pls.index(Placement.GPU, k) - k
        except ValueError:  # no device entry: all of it is on the host
            return len(pls) - k

    def block_table(self, req: Request) -> tuple[tuple[int, ...], ...]:
        table = self.tables[req.request_id]
        return tuple(tuple(ids) for ids in table.block_ids)

    def free(self, req: Request) -> None:
        """Release every block of the request (one reference each); the hooks see it first."""
        if self.hidden is not None:
            self.hidden.free(req.request_id)
        self.host_running.discard(req.request_id)
        if req.request_id not in self.tables:
            return
        for h in self.hooks:
            h.on_finish(req, self)
        table = self.tables.pop(req.request_id)
        del self.num_slots[req.request_id]
        self.num_dropped_token_blocks -= table.num_dropped_blocks
        self.gpu.free([b for _, _, b in table.entries(Placement.GPU)])
        self.host.free([b for _, _, b in table.entries(Placement.HOST)])

    def release_unfilled(self, req: Request) -> None:
        """Free the request's blocks past its computed tokens: allocated for a step it no
        longer runs in (preempted after it was scheduled), they hold no KV, and a
        preemption must move or drop only KV that exists."""
        table = self.tables.get(req.request_id)
        if table is None:
            return
        keep = cdiv(req.num_computed_tokens, self.block_size)
        if keep >= table.num_token_blocks:
            return
        tail = [(b, p) for ids, pls in zip(table.block_ids, table.placements)
                for b, p in zip(ids[keep:], pls[keep:])]
        table.truncate(keep)
        self.gpu.free([b for b, p in tail if p is Placement.GPU])
        self.host.free([b for b, p in tail if p is Placement.HOST])
        self.num_slots[req.request_id] = keep * self.block_size

    # ---- moving whole requests between tiers ------------------------------------------
    @staticmethod
    def _relocate(table: MapTable, src: Placement, dst: Placement, new_ids: list[int],
                  entries: list[tuple[int, int, int]] | None = None
                  ) -> list[tuple[int, int, int]]:
        """Give every `src` entry past the dropped prefix (or each of `entries`) the next of
        `new_ids` (-1 for nowhere) and placement `dst`; returns (old block, new block, layer
        group) per entry."""
        moves = []
        for (g, j, old), new in zip(_movable(table, src) if entries is None else entries,
                                    new_ids):
            table.block_ids[g][j], table.placements[g][j] = new, dst
            moves.append((old, new, g))
        return moves

    def _can_bring_back(self, req: Request, placement: Placement, extra_tokens: int,
                        reused: tuple[int, int] = (0, 0), use_watermark: bool = True) -> bool:
        """Room on the device for every `placement` entry plus `extra_tokens` more tokens,
        above the watermark when `use_watermark`; `reused`: (leading token blocks a hook
        gives back instead, of their device blocks the evictable ones, which are then no
        room)."""
        table = self.tables.get(req.request_id)
        away = len(_movable(table, placement)) if table else 0
        need = away - reused[0] * self.num_groups + self.blocks_needed(req, extra_tokens)
        room = self.num_available_gpu_blocks() - reused[1]
        return room - need >= (self.watermark_blocks if use_watermark else 0)

    def _device_blocks_left(self, req: Request) -> None:
        """Device blocks left the request's table: ones a hook keeps may be evictable now."""
        for h in self.hooks:
            h.on_device_release(req, self)

    def _num_evictable(self) -> int:
        """Device blocks the hooks would give back on demand."""
        return sum(h.num_evictable_device_blocks() for h in self.hooks)

    def num_available_gpu_blocks(self) -> int:
        """Device blocks an allocation can get now: the free ones and those only a cache
        holds (evicted on demand)."""
        return self.gpu.num_free + self._num_evictable()

    def allocate_evicting(self, n: int) -> list[int]:
        """`n` device blocks, evicting cached ones first if the free list is short (the
        caller checked there is room: `num_available_gpu_blocks`)."""
        if self.gpu.num_free < n and self.hooks:
            self.evict(n - self.gpu.num_free)
        return self.gpu.allocate(n)

    def swap_out(self, req: Request, num_token_blocks: int | None = None) -> list[BlockCopy] | None:
        """Move the request's device blocks to the host pool: all of them, or only the
        leading `num_token_blocks` token blocks of each group still on the device (the
        oldest KV; the table stays a host prefix then a device suffix). None, changing
        nothing, if the host pool lacks the room."""
        table = self.tables.get(req.request_id)
        if table is None:
            return []
        movable = _movable(table, Placement.GPU)
        if num_token_blocks is not None:
            first = table.num_dropped_blocks + self.num_host_token_blocks(req.request_id)
            movable = [e for e in movable if e[1] < first + num_token_blocks]
        n = len(movable)
        if not self.host.can_allocate(n):
            return None
        moves = self._relocate(table, Placement.GPU, Placement.HOST, self.host.allocate(n),
                               movable)
        self.gpu.free([old for old, _, _ in moves])
        self._device_blocks_left(req)
        return [BlockCopy(src=old, dst=new, group=g) for old, new, g in moves]

    def can_swap_in(self, req: Request, extra_tokens: int, use_watermark: bool = True) -> bool:
        """`use_watermark`: as allocate_slots' (it protects running requests)."""
        return self._can_bring_back(req, Placement.HOST, extra_tokens,
                                    use_watermark=use_watermark)

    def swap_in(self, req: Request) -> list[BlockCopy]:
        table = self.tables.get(req.request_id)
        if table is None:
            return []
        n = len(_movable(table, Placement.HOST))
        moves = self._relocate(table, Placement.HOST, Placement.GPU, self.allocate_evicting(n))
        self.host.free([old for old, _, _ in moves])
        return [BlockCopy(src=old, dst=new, group=g) for old, new, g in moves]

    # ---- hidden states instead of KV (Placement.HIDDEN) -------------------------------
    def hide(self, req: Request) -> None:
        """Free the request's device KV; its hidden states (which must cover every computed
        token) stand in for it until `unhide`."""
        assert self.hidden is not None and self.hidden.covers(req.request_id,
                                                              req.num_computed_tokens)
        table = self.tables.get(req.request_id)
        if table is None:
            return
        n = len(_movable(table, Placement.GPU))
        moves = self._relocate(table, Placement.GPU, Placement.HIDDEN, [-1] * n)
        self.gpu.free([old for old, _, _ in moves])
        self._device_blocks_left(req)

    def reusable_prefix(self, req: Request) -> tuple[int, int]:
        """(Leading token blocks of a hidden request a hook still holds, evictable ones)."""
        for h in self.hooks:
            reused = h.reusable_prefix(req, self)
            if reused[0]:
                return reused
        return 0, 0

    def can_unhide(self, req: Request, extra_tokens: int, use_watermark: bool = True) -> bool:
        """Room to bring it back (`unhide`, either way) with `extra_tokens` more tokens."""
        return self._can_bring_back(req, Placement.HIDDEN, extra_tokens,
                                    self.reusable_prefix(req), use_watermark)

    def unhide(self, req: Request, restore: bool = True) -> int:
        """Bring a hidden request's KV back: returns the leading tokens taken back from a hook
        (`reusable_prefix`). `restore`: device blocks for the other HIDDEN entries, re-projected
        by the runner; else they leave the table with the hidden states (some have none),
        and the request recomputes from the returned token on."""
        table = self.tables.get(req.request_id)
        if table is None:
            return 0
        k = 0
        for h in self.hooks:  # the first hook that holds some gives them back
            n = 0 if k else h.reusable_prefix(req, self)[0]
            h.retake_prefix(req, self, n)
            k = k or n
        if restore:
            n = len(_movable(table, Placement.HIDDEN))
            self._relocate(table, Placement.HIDDEN, Placement.GPU, self.allocate_evicting(n))
        else:
            assert self.hidden is not None and Placement.GPU not in table.placements[0][k:]
            table.truncate(k)  # only hidden entries go
            self.num_slots[req.request_id] = k * self.block_size
            self.hidden.free(req.request_id)
        return k * self.block_size

    # ---- accounting ------------------------------------------------------------------
    def check_integrity(self) -> None:
        check_manager(self)

    def gpu_slot_usage(self, requests: Iterable[Request]) -> tuple[int, int]:
        """kvtier/kv/usage.py's `gpu_slot_usage` over this manager's tables."""
        return gpu_slot_usage(self, requests)

    def num_gpu_blocks_cached(self) -> int:
        """Device blocks only a cache holds: free on demand, so not "used" (vLLM's KV usage
        counts them free too)."""
        return self._num_evictable()

    def all_free(self) -> bool:
        """No request holds memory: every device block is free or held by a cache alone
        (evictable, i.e. free on demand); the host and hidden-state pools are empty."""
        hidden_used = self.hidden.pool.num_used if self.hidden is not None else 0
        return (not self.tables and self.gpu.num_used == self._num_evictable()
                and self.host.num_used == 0 and hidden_used == 0)


def _movable(table: MapTable, placement: Placement) -> list[tuple[int, int, int]]:
    """`placement` entries past the dropped prefix: what moving a whole request moves (an
    offloaded prefix stays in the host pool until the request ends)."""
    k = table.num_dropped_blocks
    return [e for e in table.entries(placement) if e[1] >= k]
