"""Reference-counted blocks and the KV manager's cache hooks (admission, finish, eviction):
what a prefix cache will build on."""

import pytest

from kvtier.core.request import Request
from kvtier.kv.block_pool import BlockPool
from kvtier.kv.hooks import KVCacheHooks
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.map_table import MapTable, Placement
from kvtier.sampling_params import SamplingParams


def req(rid: str, n_prompt: int) -> Request:
    return Request(rid, list(range(n_prompt)), SamplingParams(max_tokens=8), max_tokens=8)


def test_a_shared_block_is_freed_only_by_its_last_owner():
    pool = BlockPool(4, "gpu")
    a = pool.allocate(2)
    pool.incref([a[0]])
    assert (pool.ref_count(a[0]), pool.ref_count(a[1])) == (2, 1)
    assert pool.decref(a) == [a[1]]  # block 0 still has an owner
    assert pool.num_free == 3 and pool.ref_count(a[0]) == 1
    pool.check_integrity([a[0]])
    with pytest.raises(AssertionError, match="ref counts"):
        pool.check_integrity([a[0], a[0]])  # two owners claimed, one reference held
    assert pool.decref([a[0]]) == [a[0]]
    assert pool.allocate(1) == [a[0]]  # the last freed comes back first
    with pytest.raises(AssertionError, match="freed twice"):
        pool.decref([3])
    with pytest.raises(AssertionError, match="cannot be shared"):
        pool.incref([3])


class KeepFinished(KVCacheHooks):
    """A cache in miniature: keeps a finished request's device blocks, gives them to the
    next request admitted with the same first token, evicts them on demand."""

    def __init__(self):
        self.kept: dict[int, list[int]] = {}  # first token -> group 0's blocks
        self.calls: list[str] = []

    def on_admit(self, req, kv):
        self.calls.append(f"admit {req.request_id}")
        blocks = self.kept.get(req.prompt_token_ids[0])
        if not blocks:
            return 0
        kv.gpu.incref(blocks)
        table = kv.tables[req.request_id] = MapTable(kv.num_groups)
        for b in blocks:
            table.append(0, b, Placement.GPU)
        kv.num_slots[req.request_id] = len(blocks) * kv.block_size
        return len(blocks) * kv.block_size

    def on_finish(self, req, kv):
        self.calls.append(f"finish {req.request_id}")
        key = req.prompt_token_ids[0]
        if key not in self.kept:
            blocks = list(kv.tables[req.request_id].block_ids[0])
            kv.gpu.incref(blocks)
            self.kept[key] = blocks

    def evict(self, num_blocks, kv):
        self.calls.append(f"evict {num_blocks}")
        freed = 0
        for key, blocks in list(self.kept.items()):
            if freed >= num_blocks:
                break
            if all(kv.gpu.ref_count(b) == 1 for b in blocks):  # no table holds them
                freed += len(kv.gpu.decref(self.kept.pop(key)))
        return freed

    def owned_device_blocks(self):
        return [b for blocks in self.kept.values() for b in blocks]


def test_hooks_see_admission_finish_and_eviction_and_integrity_counts_their_refs():
    kv = KVCacheManager(num_groups=1, block_size=4, num_gpu_blocks=4, num_host_blocks=0,
                        watermark=0.0)
    cache = KeepFinished()
    kv.add_hooks(cache)
    a = req("a", 8)
    assert kv.admit(a) == 0
    kv.allocate_slots(a, 8)
    kv.free(a)  # the cache keeps both blocks
    assert kv.gpu.num_used == 2
    kv.check_integrity()
    b = req("b", 12)  # same first token: its first 8 tokens' KV is there
    assert kv.admit(b) == 8
    shared = kv.tables["b"].block_ids[0][:]
    assert [kv.gpu.ref_count(x) for x in shared] == [2, 2]
    kv.check_integrity()
    b.num_computed_tokens = 8
    assert kv.allocate_slots(b, 4) == ((2,),)
    c = req("c", 8)
    c.prompt_token_ids[0] = 99  # another first token
    # 2 blocks wanted, 1 free, and the cache's blocks are b's too: nothing to evict
    assert kv.allocate_slots(c, 8) is None and kv.gpu.num_free == 1
    kv.free(b)  # the cache keeps its blocks; b's third one is free
    assert [kv.gpu.ref_count(x) for x in shared] == [1, 1] and kv.gpu.num_free == 2
    assert kv.allocate_slots(c, 8) is not None
    d = req("d", 4)
    d.prompt_token_ids[0] = 98
    assert kv.allocate_slots(d, 4) is not None  # 0 free: the cache evicts its entry
    assert cache.calls == ["admit a", "finish a", "admit b", "evict 1", "finish b", "evict 1"]
    assert not cache.kept and kv.gpu.num_free == 1
    kv.check_integrity()
    kv.free(c)
    kv.free(d)
    for blocks in list(cache.kept.values()):
        kv.gpu.decref(blocks)
    cache.kept.clear()
    assert kv.all_free()


def test_without_hooks_an_allocation_that_does_not_fit_changes_nothing():
    kv = KVCacheManager(num_groups=1, block_size=4, num_gpu_blocks=2, num_host_blocks=0,
                        watermark=0.0)
    assert kv.allocate_slots(req("a", 12), 12) is None
    assert kv.gpu.num_free == 2 and not kv.tables
