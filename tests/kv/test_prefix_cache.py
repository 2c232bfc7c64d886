"""Prefix cache (kvtier/kv/prefix_cache.py) on the KV manager: exact block ids, LRU order,
reference counts and check_integrity after every operation (vLLM test_prefix_caching style).
Block size 4 throughout; a fresh pool hands out ascending ids, and the last freed first."""

import pytest

from kvtier.core.request import Request, RequestStatus
from kvtier.kv.block_hash import BlockHasher
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheBusyError, PrefixCacheConfig
from kvtier.sampling_params import SamplingParams

B = 4


def make_kv(num_gpu_blocks: int = 16, num_groups: int = 1, num_host_blocks: int = 0,
            algo: str = "sha256") -> KVCacheManager:
    return KVCacheManager(num_groups=num_groups, block_size=B, num_gpu_blocks=num_gpu_blocks,
                          num_host_blocks=num_host_blocks, watermark=0.0,
                          prefix_cache=PrefixCacheConfig(hash_algo=algo))


def req(rid: str, tokens, max_tokens: int = 8) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens),
                   max_tokens=max_tokens)


def prefill(kv: KVCacheManager, r: Request) -> int:
    """Admit `r`, compute all of its tokens in one step, offer its blocks to the cache."""
    hit = kv.admit(r)
    r.num_computed_tokens = hit
    r.status = RequestStatus.RUNNING
    assert kv.allocate_slots(r, r.num_tokens - hit) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_full_blocks(r, r.num_computed_tokens)
    kv.check_integrity()
    return hit


def decode(kv: KVCacheManager, r: Request, token: int) -> None:
    """Append a sampled token, then compute it (the next step), as the scheduler does."""
    r.append_token(token)
    assert kv.allocate_slots(r, 1) is not None
    r.num_computed_tokens += 1
    kv.cache_full_blocks(r, r.num_computed_tokens)
    kv.check_integrity()


def finish(kv: KVCacheManager, r: Request,
           status: RequestStatus = RequestStatus.FINISHED_STOPPED) -> None:
    r.status = status
    kv.free(r)
    kv.check_integrity()


def preempt_recompute(kv: KVCacheManager, r: Request) -> None:
    """The scheduler's recompute preemption (policies' drop_kv): free while RUNNING."""
    r.num_preemptions += 1
    kv.free(r)
    r.num_computed_tokens = 0
    r.status = RequestStatus.WAITING
    kv.check_integrity()


def table(kv: KVCacheManager, r: Request) -> list[int]:
    return kv.tables[r.request_id].block_ids[0]


def lru(kv: KVCacheManager) -> list[tuple[int, ...]]:
    assert kv.prefix_cache is not None
    return list(kv.prefix_cache.evictable.values())


def refs(kv: KVCacheManager, ids) -> list[int]:
    return [kv.gpu.ref_count(b) for b in ids]


def test_miss_then_full_and_partial_hits_share_blocks():
    kv = make_kv()
    cache = kv.prefix_cache
    a = req("a", range(10))
    assert prefill(kv, a) == 0
    assert table(kv, a) == [0, 1, 2]
    assert list(cache.index) == BlockHasher(B).hash_tokens(list(range(8)))  # 2 full blocks
    assert refs(kv, [0, 1, 2]) == [2, 2, 1]  # block 2 is partial: not cached
    b = req("b", [*range(9), 99, 100])  # same first 9 tokens
    assert prefill(kv, b) == 8
    assert table(kv, b) == [0, 1, 3]
    c = req("c", [0, 1, 2, 3, 50, 51])  # only the first block in common
    assert prefill(kv, c) == 4
    assert table(kv, c) == [0, 4]
    assert refs(kv, [0, 1]) == [4, 3]
    d = req("d", [7, 7, 7, 7, 7])
    assert prefill(kv, d) == 0 and table(kv, d) == [5, 6]
    s = cache.stats
    assert (s.requests, s.queries, s.hits) == (4, 10 + 11 + 6 + 5, 8 + 4)
    for r in (a, b, c, d):
        finish(kv, r)
    # a's tail first, then its parent; b's and c's blocks were a's (nothing new); d's own
    assert lru(kv) == [(1,), (0,), (5,)]


def test_a_prompt_of_exactly_one_block_and_an_empty_prompt_hit_nothing():
    kv = make_kv()
    a = req("a", range(4))
    assert prefill(kv, a) == 0
    assert kv.prefix_cache.num_cached_blocks == 1
    # Its last token must be computed for logits: no hit is possible inside one block.
    b = req("b", range(4))
    assert prefill(kv, b) == 0 and table(kv, b) == [1]
    assert kv.prefix_cache.num_cached_blocks == 1  # b's copy is a duplicate: its own
    assert kv.admit(req("e", [])) == 0
    c = req("c", range(5))
    assert prefill(kv, c) == 4 and table(kv, c) == [0, 2]


def test_a_prompt_equal_to_a_cached_prompt_recomputes_only_its_last_block():
    kv = make_kv()
    a = req("a", range(8))
    prefill(kv, a)
    finish(kv, a)
    assert lru(kv) == [(1,), (0,)]
    b = req("b", range(8))
    assert prefill(kv, b) == 4  # (8 - 1) // 4 blocks: its last token is computed again
    assert table(kv, b) == [0, 2]  # block 1 stays cached and evictable
    assert lru(kv) == [(1,)] and refs(kv, [0, 1, 2]) == [2, 1, 1]
    finish(kv, b)
    assert lru(kv) == [(1,), (0,)] and kv.gpu.num_free == 14  # b's own copy is freed


def test_eviction_only_when_the_free_list_is_empty_leaves_first_lru_order():
    kv = make_kv(num_gpu_blocks=4)
    a, b = req("a", range(8)), req("b", range(10, 18))
    prefill(kv, a)
    prefill(kv, b)
    assert (table(kv, a), table(kv, b)) == ([0, 1], [2, 3])
    finish(kv, a)
    finish(kv, b)
    assert lru(kv) == [(1,), (0,), (3,), (2,)] and kv.gpu.num_free == 0
    c = req("c", range(20, 25))
    prefill(kv, c)  # 2 blocks wanted, none free: a's chain goes, its tail first
    assert table(kv, c) == [0, 1] and lru(kv) == [(3,), (2,)]
    assert kv.prefix_cache.stats.evicted_blocks == 2
    d = req("d", [*range(10, 18), 30])
    assert kv.admit(d) == 8 and table(kv, d) == [2, 3]
    assert lru(kv) == [] and refs(kv, [2, 3]) == [2, 2]
    d.num_computed_tokens = 8
    # Its third block: none free, and every cached block is referenced: nothing is freed.
    assert kv.allocate_slots(d, 1) is None
    assert refs(kv, [0, 1, 2, 3]) == [2, 1, 2, 2] and kv.gpu.num_free == 0
    kv.check_integrity()
    finish(kv, c)  # its full block 0 stays cached, its partial block 1 is freed
    assert kv.gpu.num_free == 1 and lru(kv) == [(0,)]
    assert kv.allocate_slots(d, 1) == ((1,),)
    kv.check_integrity()


def test_an_aborted_request_leaves_shared_blocks_to_the_others():
    kv = make_kv()
    a = req("a", range(8))
    prefill(kv, a)
    b = req("b", range(9))
    assert prefill(kv, b) == 8 and table(kv, b) == [0, 1, 2]
    finish(kv, a, RequestStatus.FINISHED_ABORTED)
    assert refs(kv, [0, 1]) == [2, 2] and lru(kv) == []  # the cache and b
    decode(kv, b, 9)
    decode(kv, b, 10)
    decode(kv, b, 11)  # tokens 8..11 computed: block 2 is full, b's own, now cached
    assert kv.prefix_cache.num_cached_blocks == 3
    finish(kv, b)
    assert lru(kv) == [(2,), (1,), (0,)] and refs(kv, [0, 1, 2]) == [1, 1, 1]


def test_preempt_recompute_keeps_the_blocks_cached_and_readmission_hits():
    kv = make_kv()
    cache = kv.prefix_cache
    calls = []
    fn = cache.hasher._fn
    cache.hasher._fn = lambda *args: calls.append(1) or fn(*args)
    a = req("a", range(6))
    prefill(kv, a)
    decode(kv, a, 100)
    decode(kv, a, 101)  # 8 tokens computed: blocks 0 and 1 cached
    a.append_token(102)  # sampled, not yet computed
    preempt_recompute(kv, a)
    assert lru(kv) == [(1,), (0,)] and kv.gpu.num_free == 14
    num_hashed = len(calls)
    assert kv.admit(a) == 8 and table(kv, a) == [0, 1]  # generated tokens hit too
    assert len(calls) == num_hashed  # its blocks' hashes are kept: no rehash
    s = cache.stats
    assert (s.requests, s.queries, s.hits) == (1, 6, 0)
    assert (s.preempted_requests, s.preempted_queries, s.preempted_hits) == (1, 9, 8)
    kv.check_integrity()


def test_a_rolled_back_admission_returns_its_hits_and_is_counted_once():
    kv = make_kv(num_gpu_blocks=4)
    a = req("a", range(8))
    prefill(kv, a)
    finish(kv, a)
    hog = req("hog", range(50, 54))
    prefill(kv, hog)  # one block, cached: one free block is left
    b = req("b", range(16))
    assert kv.admit(b) == 8 and table(kv, b) == [0, 1]
    b.num_computed_tokens = 8
    assert kv.allocate_slots(b, 8) is None  # 2 more blocks: 1 free, none evictable
    kv.free(b)  # the scheduler's roll-back: b waits again, its hits go back to the LRU
    b.num_computed_tokens = 0
    kv.check_integrity()
    assert lru(kv) == [(1,), (0,)] and "b" not in kv.tables
    finish(kv, hog)
    assert prefill(kv, b) == 8  # the free block and hog's, evicted
    assert table(kv, b) == [0, 1, 2, 3]
    s = kv.prefix_cache.stats
    assert (s.requests, s.queries, s.hits) == (3, 8 + 4 + 16, 8)


def test_every_layer_group_of_a_token_block_is_cached_together():
    kv = make_kv(num_groups=2)
    a = req("a", range(8))
    prefill(kv, a)
    assert kv.block_table(a) == ((0, 1), (2, 3))
    assert list(kv.prefix_cache.index.values()) == [(0, 2), (1, 3)]
    b = req("b", range(9))
    assert prefill(kv, b) == 8 and kv.block_table(b) == ((0, 1, 4), (2, 3, 5))
    finish(kv, a)
    finish(kv, b)
    assert lru(kv) == [(1, 3), (0, 2)]
    c = req("c", range(100, 128))  # 7 token blocks x 2 = 14 blocks, 12 free
    prefill(kv, c)  # one cached token block (both of its groups) is evicted
    assert lru(kv) == [(0, 2)] and kv.gpu.num_free == 0


def test_an_unknown_in_flight_token_waits_for_the_next_call():
    kv = make_kv()
    a = req("a", range(7))
    prefill(kv, a)
    # Async scheduling: the next plan computes the sampled token before its id is known.
    assert kv.allocate_slots(a, 1) is not None
    a.num_computed_tokens = 8
    kv.cache_full_blocks(a, 8)
    assert kv.prefix_cache.num_cached_blocks == 1
    a.append_token(5)  # the token comes back
    kv.cache_full_blocks(a, 8)
    assert kv.prefix_cache.num_cached_blocks == 2
    kv.check_integrity()


def test_swapped_out_blocks_stay_cached_and_evictable_and_the_copy_comes_back():
    kv = make_kv(num_gpu_blocks=8, num_host_blocks=4)
    a = req("a", range(8))
    prefill(kv, a)
    assert len(kv.swap_out(a)) == 2
    assert refs(kv, [0, 1]) == [1, 1] and lru(kv) == [(1,), (0,)]  # cache-only: evictable
    kv.check_integrity()
    kv.swap_in(a)
    assert table(kv, a) == [2, 3]  # copies: the cached blocks are never written
    kv.check_integrity()
    finish(kv, a)
    assert lru(kv) == [(1,), (0,)] and kv.gpu.num_free == 6
    b = req("b", range(9))
    assert prefill(kv, b) == 8 and table(kv, b) == [0, 1, 2]  # the original blocks hit


def test_a_swapped_request_comes_back_by_evicting_cached_blocks():
    kv = make_kv(num_gpu_blocks=4, num_host_blocks=4)
    a, b = req("a", range(8)), req("b", range(10, 18))
    prefill(kv, a)
    prefill(kv, b)
    kv.swap_out(a)
    assert kv.gpu.num_free == 0 and lru(kv) == [(1,), (0,)]
    assert kv.can_swap_in(a, 0)  # no free block, two evictable ones
    kv.swap_in(a)
    assert table(kv, a) == [0, 1] and lru(kv) == [] and kv.prefix_cache.num_cached_blocks == 2
    kv.check_integrity()
    assert not kv.can_swap_in(req("c", range(4)), 4)  # nothing free, nothing evictable


def test_reset_is_refused_while_requests_hold_blocks():
    kv = make_kv()
    a, b = req("a", range(8)), req("b", range(9))
    prefill(kv, a)
    prefill(kv, b)
    finish(kv, a)
    with pytest.raises(PrefixCacheBusyError, match=r"while requests hold KV blocks \(1: b\)"):
        kv.reset_prefix_cache()
    assert kv.prefix_cache.num_cached_blocks == 2 and refs(kv, [0, 1]) == [2, 2]
    kv.check_integrity()
    finish(kv, b)
    assert kv.reset_prefix_cache() == 2
    assert kv.all_free() and kv.prefix_cache.num_cached_blocks == 0
    kv.check_integrity()
    assert prefill(kv, req("c", range(9))) == 0  # nothing left to hit


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_block_hashes_chain_and_depend_on_every_input(algo):
    h = BlockHasher(B, algo)
    chain = h.hash_tokens(list(range(9)))
    assert len(chain) == 2 and len(set(chain)) == 2
    assert h.hash_tokens([0, 1, 2, 3, 9, 9, 9, 9])[0] == chain[0]
    assert h.hash_tokens([0, 1, 2, 3, 9, 9, 9, 9])[1] != chain[1]
    assert h.hash_tokens([4, 5, 6, 7]) != chain[1:]  # block 1 alone: no parent
    assert h.hash_tokens(list(range(4)), extra="lora-1") != chain[:1]
    r = req("r", range(9))
    hashes: list = []
    h.extend(hashes, r, 1)
    h.extend(hashes, r, 2)
    assert hashes == chain
    with pytest.raises(AssertionError, match="full blocks"):
        h.extend(hashes, r, 3)
    with pytest.raises(ValueError, match="unknown prefix-caching hash algo"):
        BlockHasher(B, "md5")  # type: ignore[arg-type]


def salted(rid: str, tokens, salt: str | None) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=8, cache_salt=salt), max_tokens=8)


@pytest.mark.parametrize("algo", ["sha256", "builtin"])
def test_a_cache_salt_shares_blocks_only_with_the_same_salt(algo):
    kv = make_kv(algo=algo)
    tokens = list(range(3 * B + 1))
    a = salted("a", tokens, "tenant-a")
    assert prefill(kv, a) == 0
    assert prefill(kv, salted("a2", tokens, "tenant-a")) == 3 * B  # the same tenant hits
    assert prefill(kv, salted("b", tokens, "tenant-b")) == 0  # another tenant does not
    assert prefill(kv, salted("none", tokens, None)) == 0  # nor an unsalted request
    assert prefill(kv, salted("none2", tokens, None)) == 3 * B  # which hits its own kind
    hasher = BlockHasher(B, algo)
    assert hasher.hash_tokens(tokens, "tenant-a")[0] != hasher.hash_tokens(tokens)[0]


def test_an_empty_or_non_string_cache_salt_is_refused():
    from kvtier.sampling_params import InvalidRequestError

    for bad in ("", 7):
        with pytest.raises(InvalidRequestError, match="cache_salt"):
            SamplingParams(cache_salt=bad)
