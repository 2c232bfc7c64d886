"""KV manager: exact block ids, all-or-nothing allocation, swaps, integrity."""

import pytest

from kvtier.core.request import Request
from kvtier.kv.block_pool import BlockPool, OutOfBlocksError
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.map_table import Placement
from kvtier.sampling_params import SamplingParams


def req(rid: str, n_prompt: int) -> Request:
    return Request(rid, list(range(n_prompt)), SamplingParams(max_tokens=8), max_tokens=8)


def test_block_pool_allocates_lowest_first_and_reuses_last_freed():
    pool = BlockPool(4, "gpu")
    assert pool.allocate(2) == [0, 1]
    assert pool.allocate(2) == [2, 3]
    pool.free([0, 1])
    assert pool.allocate(2) == [0, 1]
    pool2 = BlockPool(4, "gpu")
    a = pool2.allocate(1)
    assert a == [0]
    pool2.free(a)
    assert pool2.allocate(1) == [0]
    with pytest.raises(OutOfBlocksError):
        pool2.allocate(4)
    with pytest.raises(AssertionError):
        pool2.free([3])


def test_allocate_per_layer_group_and_free():
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=8, num_host_blocks=8,
                        watermark=0.0)
    r = req("a", 5)
    new = kv.allocate_slots(r, 5)  # 2 token blocks x 2 groups
    assert [len(g) for g in new] == [2, 2]
    assert kv.gpu.num_used == 4
    r.num_computed_tokens = 5
    assert kv.allocate_slots(r, 3) == ((), ())  # 8 tokens still fit in 2 blocks
    new2 = kv.allocate_slots(r, 4)  # 9 tokens: a third block per group
    assert [len(g) for g in new2] == [1, 1]
    kv.check_integrity()
    kv.free(r)
    assert kv.all_free()
    kv.check_integrity()


def test_allocation_is_all_or_nothing():
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=5, num_host_blocks=0,
                        watermark=0.0)
    r = req("a", 12)  # needs 3 x 2 = 6 blocks
    assert kv.allocate_slots(r, 12) is None
    assert kv.gpu.num_free == 5 and "a" not in kv.tables
    kv.check_integrity()


def test_swap_out_and_in_round_trip():
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=6, num_host_blocks=4,
                        watermark=0.0)
    r = req("a", 8)
    kv.allocate_slots(r, 8)
    r.num_computed_tokens = 8
    before = kv.block_table(r)
    out = kv.swap_out(r)
    assert sorted(c.src for c in out) == sorted(b for g in before for b in g)
    assert kv.gpu.num_used == 0 and kv.host.num_used == 4
    assert all(p is Placement.HOST for g in kv.tables["a"].placements for p in g)
    kv.check_integrity()
    assert kv.can_swap_in(r, 1)
    back = kv.swap_in(r)
    assert sorted(c.src for c in back) == sorted(c.dst for c in out)
    assert kv.host.num_used == 0 and kv.gpu.num_used == 4
    kv.check_integrity()


def test_swap_out_refuses_when_host_full():
    kv = KVCacheManager(num_groups=1, block_size=4, num_gpu_blocks=4, num_host_blocks=1,
                        watermark=0.0)
    r = req("a", 8)
    kv.allocate_slots(r, 8)
    assert kv.swap_out(r) is None
    assert kv.gpu.num_used == 2 and kv.host.num_used == 0
    kv.check_integrity()


def test_integrity_catches_a_leak():
    kv = KVCacheManager(num_groups=1, block_size=4, num_gpu_blocks=4, num_host_blocks=0)
    kv.gpu.allocate(1)  # owned by nobody
    with pytest.raises(AssertionError, match="leaked"):
        kv.check_integrity()


def test_gpu_slot_usage_counts_unfilled_tails_on_the_device_only():
    kv = KVCacheManager(num_groups=3, block_size=4, num_gpu_blocks=30, num_host_blocks=12,
                        watermark=0.0)
    a, b = req("a", 10), req("b", 4)
    kv.allocate_slots(a, 10)  # 3 token blocks x 3 groups: 36 slots, 30 filled
    kv.allocate_slots(b, 4)  # 1 token block x 3 groups: 12 slots, full
    a.num_computed_tokens, b.num_computed_tokens = 10, 4
    assert kv.gpu_slot_usage([a, b]) == (48, 42)
    assert kv.gpu_slot_usage([]) == (0, 0)
    kv.drop_prefix(a, 1)  # tokens 0-3 dropped: 2 token blocks x 3 groups left, 6 filled each
    assert kv.gpu_slot_usage([a]) == (24, 18)
    b.num_computed_tokens = 3  # a block allocated ahead of the tokens it will hold
    assert kv.gpu_slot_usage([b]) == (12, 9)
    kv.swap_out(b)  # host blocks are not device slots
    assert kv.gpu_slot_usage([b]) == (0, 0)
    kv.tables["a"].placements[1][2] = Placement.HOST  # a mixed group: the slow path agrees
    assert kv.gpu_slot_usage([a]) == (20, 16)
    kv.tables["a"].placements[1][2] = Placement.GPU
    kv.check_integrity()


def test_drop_prefix_offloads_top_groups_to_host():
    # 4 groups, the top 3 keep the dropped prefix in the host pool; group 0 recomputes it.
    kv = KVCacheManager(num_groups=4, block_size=4, num_gpu_blocks=40, num_host_blocks=6,
                        watermark=0.0, prefix_host_groups=3)
    r = req("a", 12)
    kv.allocate_slots(r, 12)  # 3 token blocks x 4 groups
    r.num_computed_tokens = 12
    gpu_before = kv.block_table(r)
    assert kv.drop_prefix(r, 2) == 8  # 2 token blocks x 4 groups leave the device
    table = kv.tables["a"]
    assert table.placements[0][:2] == [Placement.DROPPED] * 2
    for g in (1, 2, 3):
        assert table.placements[g][:2] == [Placement.HOST] * 2
    assert kv.num_dropped_tokens(r) == 8
    copies = kv.take_pending_swap_out()
    assert sorted((c.group, c.src) for c in copies) == sorted(
        (g, gpu_before[g][j]) for g in (1, 2, 3) for j in (0, 1))
    host = kv.prefix_host_blocks(r)
    assert host[0] == () and all(len(host[g]) == 2 for g in (1, 2, 3))
    assert {c.dst for c in copies} == {b for g in (1, 2, 3) for b in host[g]}
    assert kv.host.num_used == 6 and kv.gpu.num_used == 4
    kv.check_integrity()
    # The host pool is full: a further drop changes nothing and frees nothing.
    assert kv.drop_prefix(r, 3) == 0 and kv.num_dropped_tokens(r) == 8
    kv.check_integrity()
    kv.free(r)
    assert kv.all_free()


def test_prefix_host_groups_must_leave_a_recomputing_group():
    with pytest.raises(ValueError, match="prefix_host_groups"):
        KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=8, num_host_blocks=8,
                       prefix_host_groups=2)
