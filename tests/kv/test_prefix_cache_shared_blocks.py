"""Swap and eLLM over blocks shared through the prefix cache: a shared block is copied, never
moved or written (swap-out copies it and drops the request's reference; swap-in brings back
a private copy; a dropped or host-offloaded prefix releases the reference and the cached
block stays), and eLLM drops prefixes only where that frees memory. Exact block ids."""

from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.policies.ellm import EllmOptions, EllmPolicy
from tests.kv.test_prefix_cache import B, finish, prefill, refs, req, table


def make_kv(num_gpu_blocks: int = 16, num_groups: int = 1, num_host_blocks: int = 8,
            prefix_host_groups: int = 0) -> KVCacheManager:
    return KVCacheManager(num_groups=num_groups, block_size=B, num_gpu_blocks=num_gpu_blocks,
                          num_host_blocks=num_host_blocks, watermark=0.0,
                          prefix_host_groups=prefix_host_groups,
                          prefix_cache=PrefixCacheConfig(hash_algo="builtin"))


def in_decode(kv: KVCacheManager, r: Request) -> Request:
    prefill(kv, r)
    r.append_token(7)  # computed == prompt: a decode next
    return r


def cached_ids(kv: KVCacheManager) -> set[int]:
    return {b for ids in kv.prefix_cache.index.values() for b in ids}


def test_swap_copies_a_shared_block_and_brings_back_a_private_copy():
    kv = make_kv()
    a, b = req("a", range(12)), req("b", [*range(8), 50, 51, 52])
    prefill(kv, a)
    assert prefill(kv, b) == 8 and table(kv, b) == [0, 1, 3]
    copies = kv.swap_out(b)
    assert [c.src for c in copies] == [0, 1, 3]  # the shared blocks are read, not moved
    assert refs(kv, [0, 1]) == [2, 2] and table(kv, a) == [0, 1, 2]  # the cache and a
    kv.check_integrity()
    b.status = RequestStatus.SWAPPED
    assert kv.can_swap_in(b, 1)
    back = kv.swap_in(b)
    assert not {c.dst for c in back} & cached_ids(kv)  # never written: private copies
    assert table(kv, b) == [3, 4, 5] and refs(kv, [0, 1]) == [2, 2]
    kv.check_integrity()
    finish(kv, b)
    finish(kv, a)
    assert kv.all_free()


def test_a_dropped_shared_prefix_releases_the_reference_and_the_block_stays_cached():
    kv = make_kv(num_groups=2, prefix_host_groups=1)
    a, b = in_decode(kv, req("a", range(12))), in_decode(kv, req("b", [*range(8), 50, 51, 52]))
    assert kv.tables["b"].block_ids == [[0, 1, 6], [3, 4, 7]]  # a's first two token blocks
    before = dict(kv.prefix_cache.index)
    assert kv.drop_prefix(b, 2) == 4  # references released
    # Group 0 is dropped (recomputed into scratch), group 1 copied to the host: both read
    # the shared blocks, and only b's references go.
    assert [(c.src, c.group) for c in kv.take_pending_swap_out()] == [(3, 1), (4, 1)]
    assert refs(kv, [0, 1, 3, 4]) == [2, 2, 2, 2] and kv.prefix_cache.index == before
    assert kv.tables["a"].block_ids == [[0, 1, 2], [3, 4, 5]]
    kv.check_integrity()
    kv.cache_full_blocks(b, b.num_computed_tokens)  # a dropped block is never registered
    assert kv.prefix_cache.index == before
    finish(kv, a)
    finish(kv, b)
    assert kv.all_free()


def _ellm() -> EllmPolicy:
    return EllmPolicy(EllmOptions(max_uncached_ratio=0.9, recompute_budget="max"))


def test_ellm_does_not_drop_a_prefix_that_another_request_shares_for_nothing():
    kv, policy = make_kv(), _ellm()
    a = in_decode(kv, req("a", range(16)))
    b = in_decode(kv, req("b", [*range(12), 50, 51, 52, 53, 54]))
    assert table(kv, b)[:3] == table(kv, a)[:3]  # held by a, b and the cache
    free = kv.gpu.num_free
    # Every block either could drop is shared: dropping them would free nothing.
    assert not policy.make_room([a, b], kv, 1)
    assert kv.num_dropped_tokens(a) == kv.num_dropped_tokens(b) == 0
    assert kv.gpu.num_free == free


def test_ellm_drops_through_a_shared_prefix_to_the_requests_own_blocks():
    kv, policy = make_kv(), _ellm()
    a = in_decode(kv, req("a", range(16)))
    b = in_decode(kv, req("b", [*range(12), *range(50, 59)]))  # 3 shared, 2 own full blocks
    free = kv.gpu.num_free
    assert policy.make_room([a, b], kv, 1)
    assert kv.num_dropped_tokens(b) == 16 and kv.num_dropped_tokens(a) == 0
    # Its own block 3 is cached too (cache only now): evictable, i.e. room.
    assert kv.gpu.num_free + kv.prefix_cache.num_evictable_device_blocks() == free + 1
    kv.check_integrity()
    assert kv.allocate_slots(req("c", range(100, 100 + 4 * (free + 1))), 4 * (free + 1))
