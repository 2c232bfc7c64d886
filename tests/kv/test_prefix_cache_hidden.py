"""HCache's hidden requests over the prefix cache (kvtier/kv/manager.py hide/unhide with the
cache's reusable_prefix/retake_prefix hooks): a hidden request holds no device block, its
hidden states start after its hit, and it comes back by taking back the cached prefix, or
recomputes from where the cache still holds it. Exact block ids, as in test_prefix_cache."""

import pytest

from kvtier.config import SystemOptions
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.map_table import Placement
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.policies.base import PreemptionKind
from kvtier.policies.hcache import HCachePolicy, HiddenStore
from tests.kv.test_prefix_cache import B, finish, lru, refs, req, table


def make_kv(num_gpu_blocks: int = 16) -> KVCacheManager:
    return KVCacheManager(num_groups=1, block_size=B, num_gpu_blocks=num_gpu_blocks,
                          num_host_blocks=0, watermark=0.0, hidden_store=HiddenStore(16, B),
                          prefix_cache=PrefixCacheConfig(hash_algo="builtin"))


def run(kv: KVCacheManager, r: Request) -> int:
    """Admit `r` and compute all its tokens in one step, keeping hidden states from its first
    computed token on (the scheduler's _make_plan)."""
    hit = r.num_computed_tokens = kv.admit(r)
    r.status = RequestStatus.RUNNING
    assert kv.allocate_slots(r, r.num_tokens - hit) is not None
    r.num_computed_tokens = r.num_tokens
    kv.cache_full_blocks(r, r.num_tokens)
    kv.hidden.extend(r.request_id, r.num_tokens, hit)
    kv.check_integrity()
    return hit


def test_hidden_states_start_after_the_hit_and_unhide_takes_the_prefix_back():
    kv, policy = make_kv(), HCachePolicy(SystemOptions())
    a, b = req("a", range(12)), req("b", [*range(8), 50, 51, 52])
    run(kv, a)
    assert run(kv, b) == 8 and table(kv, b) == [0, 1, 3]  # a's first two blocks
    assert kv.hidden.first_token("b") == 8 and kv.hidden.ids["b"] == [3]  # none for the hit
    assert kv.hidden.covers("b", 11) and not kv.hidden.covers("a", 13)
    p = policy.preempt(b, kv)
    assert p.kind is PreemptionKind.HIDDEN and b.status is RequestStatus.SWAPPED
    # Its references are gone (a and the cache still hold the shared blocks), no pins.
    assert refs(kv, [0, 1]) == [2, 2] and kv.gpu.ref_count(3) == 0
    assert kv.tables["b"].placements[0] == [Placement.HIDDEN] * 3
    kv.check_integrity()
    assert kv.reusable_prefix(b) == (2, 0)  # cached, and in use by a: not evictable
    assert policy.can_resume(b, kv, 1)
    work = policy.resume(b, kv)
    assert (work.restore_from, work.restore_tokens) == (8, 3)  # only its own tokens
    assert table(kv, b)[:2] == [0, 1] and refs(kv, [0, 1]) == [3, 3]
    kv.check_integrity()
    finish(kv, a)
    finish(kv, b)
    assert kv.all_free()


def test_an_evicted_hit_is_recomputed_from_the_cached_part():
    kv, policy = make_kv(num_gpu_blocks=6), HCachePolicy(SystemOptions())
    a, b = req("a", range(12)), req("b", [*range(8), 50, 51, 52])
    run(kv, a)
    finish(kv, a)
    assert run(kv, b) == 8 and table(kv, b) == [0, 1, 3]
    policy.preempt(b, kv)
    assert lru(kv) == [(2,), (1,), (0,)] and kv.gpu.ref_count(3) == 0  # its partial block
    kv.check_integrity()
    c = req("c", range(100, 120))
    assert kv.allocate_slots(c, 20) is not None  # 3 free blocks, then evicts blocks 2 and 1
    assert lru(kv) == [(0,)]
    assert kv.reusable_prefix(b) == (1, 1)  # block 0 only, and it is evictable
    assert not policy.can_resume(b, kv, 3)  # 1 free block + 1 evictable that it takes itself
    finish(kv, c)
    assert policy.can_resume(b, kv, 3)
    work = policy.resume(b, kv)
    assert work.restore_tokens == 0 and b.num_computed_tokens == 4  # recompute from token 4
    assert table(kv, b) == [0] and "b" not in kv.hidden.ids
    kv.check_integrity()
    assert kv.allocate_slots(b, 7) is not None  # the scheduler's chunk from there
    b.num_computed_tokens = 11
    kv.cache_full_blocks(b, 11)
    kv.hidden.extend("b", 11, 4)
    assert kv.hidden.first_token("b") == 4
    kv.check_integrity()
    finish(kv, b)
    assert kv.all_free()


def test_unhide_without_a_hit_takes_back_its_own_cached_blocks():
    kv = make_kv()
    a = req("a", range(10))
    run(kv, a)
    kv.hide(a)
    assert kv.gpu.num_used == 2 and lru(kv) == [(1,), (0,)]  # cached; the partial one freed
    assert kv.reusable_prefix(a) == (2, 2)
    assert kv.unhide(a) == 8 and table(kv, a)[:2] == [0, 1]
    assert kv.tables["a"].placements[0] == [Placement.GPU] * 3 and lru(kv) == []
    kv.check_integrity()


def test_a_store_that_cannot_start_after_a_hit_is_refused():
    class NoSharing(HiddenStore):
        shares_blocks = False

    with pytest.raises(ValueError, match="cannot start after a cache hit"):
        KVCacheManager(num_groups=1, block_size=B, num_gpu_blocks=4, num_host_blocks=0,
                       hidden_store=NoSharing(4, B), prefix_cache=PrefixCacheConfig())
