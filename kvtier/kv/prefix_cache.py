"""Automatic prefix caching on the device tier: full KV blocks stay after their request ends,
indexed by chained content hash (kvtier/kv/block_hash.py), and a later request whose
prompt starts with the same tokens takes them instead of computing them. Pure Python, no
tensors, like the KV manager it plugs into as `KVCacheHooks`. docs/PREFIX_CACHE.md says
why block hashing and not a radix tree.

One cached token block = one physical device block per layer group (every group is cached
together: a hit must supply the KV of all layers). A cached block is full and immutable:
its request writes only later positions, and a hit covers whole blocks only.

Ownership. The cache holds one reference to each block it indexes; every request whose
table holds the block holds one more. A block whose only owner is the cache is evictable:

      ref count:  1 (cache only)           2+ (cache + tables)
                  `evictable`, LRU order   in use: never evicted, never written
                  <-- last table releases --+
                  --- a hit (on_admit) ---->

The LRU is filled when a request ends (`on_finish`), its blocks tail first, so a chain is
evicted leaf before parent (vLLM frees a request's blocks in reverse for the same reason);
eviction happens only when the free list is short (`evict`, called by `allocate_slots`).
When a request's device blocks leave its table without it ending (swap-out, a hide,
a dropped prefix), the manager calls `on_device_release`: the cached ones only the
cache still holds go to the LRU the same way.

When a block is cached (`cache_full_blocks(req, num_computed_tokens, kv)`): the caller
promises that the KV of `req`'s first `num_computed_tokens` tokens is written by steps
already planned, i.e. launched before any step that could read a hit on them (the GPU runs
steps in order). The scheduler calls it once a step has been planned, for each request
whose planned tokens fill a block or that the step admits (its hit may be loaded in the
step); `on_finish` calls it for the request's computed tokens, so a preempted request's KV
stays cached. Blocks with a token id not yet known on the host
(async scheduling's in-flight token) wait for the next call.

Admission (`on_admit`): the longest cached prefix, block-aligned, never every token (the
last one is computed so the request has logits): at most (num_tokens - 1) // block_size
blocks.

A lower tier (`lower`, a `PrefixTier` of kvtier/kv/hooks.py: the host tier) sees blocks
enter and leave the index and extends an admission's device hits with blocks it loads."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from weakref import WeakKeyDictionary

from kvtier.core.request import Request
from kvtier.kv.block_hash import BlockHash, BlockHasher, HashAlgo
from kvtier.kv.hooks import KVCacheHooks, PrefixTier
from kvtier.kv.map_table import MapTable, Placement
from kvtier.kv.prefix_cache_stats import PrefixCacheStats as PrefixCacheStats

if TYPE_CHECKING:
    from kvtier.kv.manager import KVCacheManager


@dataclass(frozen=True)
class PrefixCacheConfig:
    hash_algo: HashAlgo = "sha256"


class PrefixCacheBusyError(RuntimeError):
    pass


# A cached token block: one device block per layer group. A plain tuple of ints, not an
# object: the garbage collector stops tracking such tuples, so a cache of 10^5 blocks
# adds nothing to a gen-2 collection's walk.
CachedBlock = tuple[int, ...]


@dataclass(eq=False)
class _RequestState:
    hashes: list[BlockHash] = field(default_factory=list)  # its full blocks' chain, so far
    num_registered: int = 0  # leading blocks of its table offered to the index already
    episode: int = -1  # req.num_preemptions at its last counted lookup
    queried: int = 0
    hit: int = 0
    device_hits: int = 0  # leading device hits told the lower tier in that episode


def cache_salt_key(req: Request) -> Hashable:
    """What keys a request's blocks besides their tokens: its cache salt (None: nothing)."""
    return req.sampling_params.cache_salt


class PrefixCache(KVCacheHooks):
    def __init__(self, block_size: int, num_groups: int,
                 config: PrefixCacheConfig = PrefixCacheConfig(),
                 extra_key: Callable[[Request], Hashable] = cache_salt_key):
        self.block_size, self.num_groups, self.config = block_size, num_groups, config
        self.hasher = BlockHasher(block_size, config.hash_algo)
        self.extra_key = extra_key
        self.index: dict[BlockHash, CachedBlock] = {}
        self.evictable: OrderedDict[BlockHash, CachedBlock] = OrderedDict()  # LRU first
        # Hashes live as long as the request (a preempted one keeps them: same tokens);
        # weak keys, so a request dropped anywhere takes its state with it.
        self._states: WeakKeyDictionary[Request, _RequestState] = WeakKeyDictionary()
        # Requests whose table may hold registered or hit blocks.
        self._live: dict[str, tuple[Request, _RequestState]] = {}
        self.stats = PrefixCacheStats()
        self.lower: PrefixTier | None = None  # a tier below this one (the host tier)

    @property
    def num_cached_blocks(self) -> int:
        return len(self.index)

    @property
    def num_evictable_blocks(self) -> int:
        """Token blocks; each is `num_groups` device blocks."""
        return len(self.evictable)

    def num_evictable_device_blocks(self) -> int:
        return len(self.evictable) * self.num_groups

    def _state(self, req: Request) -> _RequestState:
        state = self._states.get(req)
        if state is None:
            state = self._states[req] = _RequestState()
        return state

    def _hashes(self, req: Request, state: _RequestState, num_blocks: int) -> list[BlockHash]:
        if len(state.hashes) < num_blocks:
            self.hasher.extend(state.hashes, req, num_blocks, self.extra_key(req))
        return state.hashes

    def _max_hit_blocks(self, req: Request) -> int:
        """The most leading blocks an admission may hit: its last token is always computed
        (it needs logits), and a request asking for prompt logprobs computes its whole
        prompt (vLLM's rule: a cached token has no logits; its blocks are still cached)."""
        if req.sampling_params.prompt_logprobs is not None:
            return 0
        return max(0, (req.num_tokens - 1) // self.block_size)

    def admission_hashes(self, req: Request) -> tuple[list[BlockHash], int]:
        """(hashes of the blocks an admission could hit, how many lead the index now): a
        look-up that changes nothing but the request's hash cache."""
        max_blocks = self._max_hit_blocks(req)
        hashes, index = self._hashes(req, self._state(req), max_blocks), self.index
        n = 0
        while n < max_blocks and hashes[n] in index:
            n += 1
        return hashes[:max_blocks], n

    # ---- hooks ---------------------------------------------------------------------------
    def on_admit(self, req: Request, kv: KVCacheManager) -> int:
        rid = req.request_id
        assert rid not in kv.tables, f"{rid} is admitted while it holds blocks"
        state = self._state(req)
        max_blocks = self._max_hit_blocks(req)
        hashes, index = self._hashes(req, state, max_blocks), self.index
        hits: list[CachedBlock] = []
        for j in range(max_blocks):
            ids = index.get(hashes[j])
            if ids is None:
                break
            hits.append(ids)
        # A retried admission (its last try did not fit) replaces that try's count and
        # tells the lower tier no hit twice.
        retried = state.episode == req.num_preemptions
        told = state.device_hits if retried else 0
        self._count_lookup(req, state, len(hits) * self.block_size, retried)
        if hits:
            evictable = self.evictable
            for h in hashes[: len(hits)]:
                evictable.pop(h, None)  # a table holds it now
            kv.gpu.incref([b for ids in hits for b in ids])
        lower, num_device = self.lower, len(hits)
        state.device_hits = max(told, num_device)
        if lower is not None:  # after the incref: its loads may evict, never these
            if num_device > told:
                lower.on_device_hits(hashes[told:num_device], hits[told:], kv)
            if num_device < max_blocks:
                hits += lower.extend(req, num_device, hashes[num_device:max_blocks], kv)
        if not hits:
            return 0
        table = kv.tables[rid] = MapTable(self.num_groups)
        # Per layer group, the blocks in token order (one zip, not an append per block).
        for g, group_ids in enumerate(zip(*hits)):
            table.block_ids[g] = list(group_ids)
            table.placements[g] = [Placement.GPU] * len(group_ids)
        num_cached = len(hits) * self.block_size
        kv.num_slots[rid] = num_cached
        # Loaded blocks are registered with the plan that loads them (cache_full_blocks).
        state.num_registered = num_device
        self._live[rid] = (req, state)
        return num_cached

    def _count_lookup(self, req: Request, state: _RequestState, num_hit: int,
                      retried: bool) -> None:
        self.stats.count_lookup(req.num_preemptions > 0, req.num_tokens, num_hit,
                                (state.queried, state.hit) if retried else None)
        state.episode, state.queried, state.hit = req.num_preemptions, req.num_tokens, num_hit

    def cache_full_blocks(self, req: Request, num_computed_tokens: int,
                          kv: KVCacheManager) -> None:
        """Index `req`'s blocks that `num_computed_tokens` (see the module's contract) fill
        with known tokens; blocks already offered are skipped, so a call is cheap."""
        rid = req.request_id
        n_full = min(num_computed_tokens, req.num_tokens) // self.block_size
        live = self._live.get(rid)
        if live is not None and n_full <= live[1].num_registered:
            return
        table = kv.tables.get(rid)
        if table is None:
            return
        state = live[1] if live is not None else self._state(req)
        assert n_full <= table.num_token_blocks, f"{rid}: computed tokens past its table"
        self._live[rid] = (req, state)
        hashes, index = self._hashes(req, state, n_full), self.index
        start, placements = state.num_registered, table.placements[0]
        # The new token blocks' device blocks, one tuple per token block (layer groups).
        columns = zip(*(group[start:n_full] for group in table.block_ids))
        new_refs: list[int] = []
        for j, ids in zip(range(start, n_full), columns):
            h = hashes[j]
            # Cached already (another request computed the same tokens) or not on the
            # device (a dropped prefix): this copy stays the request's own.
            if h in index or placements[j] is not Placement.GPU:
                continue
            index[h] = ids
            new_refs += ids
            if self.lower is not None:
                self.lower.on_cached(h, ids, kv)
        kv.gpu.incref(new_refs)
        state.num_registered = n_full

    def on_finish(self, req: Request, kv: KVCacheManager) -> None:
        n = req.num_computed_tokens
        if self.lower is not None:  # a rolled-back admission's loads never ran
            n = self.lower.on_finish(req, n, kv)
        self.cache_full_blocks(req, n, kv)
        live = self._live.pop(req.request_id, None)
        if req.status.finished:
            self._states.pop(req, None)
        if live is not None:
            # Called before the table's release: a block it holds is then cache-only.
            self._to_lru(live[1], kv.tables[req.request_id], kv, table_releases=True)
            live[1].num_registered = 0

    def on_device_release(self, req: Request, kv: KVCacheManager) -> None:
        """Some of `req`'s device blocks have just left its table (swap-out, hide, a dropped
        prefix; the manager calls this after their release): the cached ones nobody holds
        any more become evictable. The request stays live."""
        live = self._live.get(req.request_id)
        if live is not None:
            self._to_lru(live[1], kv.tables[req.request_id], kv, table_releases=False)

    def reusable_prefix(self, req: Request, kv: KVCacheManager) -> tuple[int, int]:
        """The leading registered blocks of `req` (its hit, then the ones it computed and
        offered) still in the index: a request that comes back takes them instead of
        rebuilding their KV."""
        live = self._live.get(req.request_id)
        if live is None:
            return 0, 0
        state, index, evictable = live[1], self.index, self.evictable
        n = num_evictable = 0
        for h in state.hashes[: state.num_registered]:
            if h not in index:
                break
            n += 1
            num_evictable += self.num_groups if h in evictable else 0
        return n, num_evictable

    def retake_prefix(self, req: Request, kv: KVCacheManager, num_token_blocks: int) -> None:
        live = self._live.get(req.request_id)
        if live is None:
            return
        state, table = live[1], kv.tables[req.request_id]
        refs: list[int] = []
        for j, h in enumerate(state.hashes[:num_token_blocks]):
            ids = self.evictable.pop(h, None) or self.index[h]
            for g, b in enumerate(ids):
                assert table.placements[g][j] is not Placement.GPU, "retaken over device KV"
                table.block_ids[g][j], table.placements[g][j] = b, Placement.GPU
            refs += ids
        kv.gpu.incref(refs)
        # Later blocks get new device blocks (or are recomputed): offered to the index again.
        state.num_registered = num_token_blocks

    def holds_entry(self, req: Request, kv: KVCacheManager, token_block: int) -> bool:
        live = self._live.get(req.request_id)
        if live is None or token_block >= live[1].num_registered:
            return False
        ids = self.index.get(live[1].hashes[token_block])
        table = kv.tables[req.request_id]
        return ids is not None and ids[0] == table.block_ids[0][token_block] \
            and table.placements[0][token_block] is Placement.GPU

    def _to_lru(self, state: _RequestState, table: MapTable, kv: KVCacheManager,
                table_releases: bool) -> None:
        """Append the request's registered blocks that only the cache will hold to the
        LRU, tail first (leaves are evicted before their parents)."""
        own, placements = table.block_ids[0], table.placements[0]
        index, evictable, ref_count = self.index, self.evictable, kv.gpu.ref_count
        for j in range(state.num_registered - 1, -1, -1):
            h = state.hashes[j]
            ids = index.get(h)
            if ids is None or h in evictable:
                continue
            held = table_releases and own[j] == ids[0] and placements[j] is Placement.GPU
            if ref_count(ids[0]) == 1 + held:  # nobody else holds it
                evictable[h] = ids

    def evict(self, num_blocks: int, kv: KVCacheManager) -> int:
        freed = 0
        while freed < num_blocks and self.evictable:
            h, ids = self.evictable.popitem(last=False)
            del self.index[h]
            if self.lower is not None:  # its copy goes before the blocks' reuse
                self.lower.on_evict(h, ids, kv)
            n = len(kv.gpu.decref(list(ids)))
            assert n == len(ids), "an evictable block had another owner"
            freed += n
            self.stats.evicted_blocks += 1
        return freed

    def touch(self, hashes: Iterable[BlockHash]) -> int:
        """Make these cached blocks the most recently used; how many of them are evictable."""
        n = 0
        for h in hashes:
            if h in self.evictable:
                self.evictable.move_to_end(h)
                n += 1
        return n

    def adopt(self, h: BlockHash, ids: CachedBlock) -> bool:
        """Index device blocks a lower tier filled (a prefetch), taking over its reference
        to each, as the most recently used evictable blocks; False (nothing taken) when the
        hash is cached already."""
        if h in self.index:
            return False
        self.index[h] = self.evictable[h] = ids
        return True

    def owned_device_blocks(self) -> Iterable[int]:
        return [b for ids in self.index.values() for b in ids]

    # ---- reset and integrity ---------------------------------------------------------------
    def reset(self, kv: KVCacheManager) -> int:
        """Drop every cached block (LLM.reset_prefix_cache); returns the token blocks dropped.
        Refused, with nothing changed, while any request holds KV blocks: a running request
        keeps registering its blocks as they fill, so a reset under it (typically before a
        weight update) would leave KV computed before the reset in the cache."""
        if kv.tables:
            ids = sorted(kv.tables)
            raise PrefixCacheBusyError(
                "cannot reset the prefix cache while requests hold KV blocks "
                f"({len(ids)}: {', '.join(ids[:8])}{', ...' if len(ids) > 8 else ''}); "
                "let them finish or abort them first")
        assert not self._live, "a live request without a table"
        n = len(self.index)
        kv.gpu.decref([b for ids in self.index.values() for b in ids])
        self.index.clear()
        self.evictable.clear()
        if self.lower is not None:
            self.lower.reset(kv)
        return n

    def check_integrity(self, kv: KVCacheManager) -> None:
        """The index, the LRU and the live requests agree with each other and with the
        device pool's reference counts (the pool checks the counts themselves)."""
        ref_count, block_hash = kv.gpu.ref_count, {}
        for h, ids in self.index.items():
            assert len(ids) == self.num_groups, h
            refs = {ref_count(b) for b in ids}
            assert len(refs) == 1 and min(refs) >= 1, f"cached block refs {refs}"
            for b in ids:
                assert b not in block_hash, f"block {b} cached twice"
                block_hash[b] = h
        for h, ids in self.evictable.items():
            assert self.index.get(h) == ids, "an evictable block is not in the index"
            assert ref_count(ids[0]) == 1, "an evictable block is in use"
        for rid, (req, state) in self._live.items():
            table = kv.tables.get(rid)
            assert table is not None, f"{rid} is live in the cache but holds no table"
            assert state.num_registered <= min(len(state.hashes), table.num_token_blocks)
            assert state.hashes == self.hasher.hash_tokens(
                req.token_ids_slice(0, len(state.hashes) * self.block_size),
                self.extra_key(req)), f"{rid}: stale block hashes"
            for j, b in enumerate(table.block_ids[0]):  # a cached block sits at its hash
                if table.placements[0][j] is Placement.GPU and b in block_hash:
                    assert j < state.num_registered and block_hash[b] == state.hashes[j], (
                        f"{rid}: token block {j} holds another prefix's cached block")
        for rid, table in kv.tables.items():
            if rid not in self._live:  # host block ids are another pool's numbers
                on_gpu = {b for b, p in zip(table.block_ids[0], table.placements[0])
                          if p is Placement.GPU}
                assert not block_hash.keys() & on_gpu, (
                    f"{rid} holds cached blocks the cache does not know it holds")
        for h, ids in self.index.items():
            if ref_count(ids[0]) == 1:
                assert h in self.evictable, "a cache-only block is not evictable"
        s = self.stats
        assert 0 <= s.hits <= s.queries and 0 <= s.preempted_hits <= s.preempted_queries
        if self.lower is not None:
            self.lower.check_integrity(kv)
