"""The KV manager's invariants, which tests check after every step (`check_integrity`):
every table's shape and placements, its slot and dropped-block counts, every pool's reference
counts against their owners (tables and the caches plugged in as hooks), then each cache's and
the hidden-state store's own checks. Read-only."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.kv.map_table import Placement

if TYPE_CHECKING:
    from kvtier.kv.manager import KVCacheManager


def check_manager(kv: KVCacheManager) -> None:
    gpu_owned: list[int] = []
    host_owned: list[int] = []
    for rid, table in kv.tables.items():
        lengths = {len(ids) for ids in table.block_ids}
        assert len(lengths) == 1, f"{rid}: layer groups have different block counts"
        first_host = kv.num_groups - table.num_host_groups
        for g, pls in enumerate(table.placements):  # the missing prefix of every group
            k = table.num_dropped_blocks
            off = Placement.HOST if g >= first_host else Placement.DROPPED
            assert all(p is off for p in pls[:k]), f"{rid}: dropped prefix"
            assert Placement.DROPPED not in pls[k:], f"{rid}: a hole after the prefix"
        gpu_owned += [b for _, _, b in table.entries(Placement.GPU)]
        host_owned += [b for _, _, b in table.entries(Placement.HOST)]
        if rid in kv.host_running:  # a host prefix, then a device suffix, in every group
            k = table.num_dropped_blocks
            held = sum(p is Placement.HOST for p in table.placements[0][k:])
            assert held > 0, f"{rid}: runs from the host pool with nothing there"
            for pls in table.placements:
                assert all(p is Placement.HOST for p in pls[k:k + held]) \
                    and all(p is Placement.GPU for p in pls[k + held:]), \
                    f"{rid}: runs from the host pool, yet not as a host prefix and a device suffix"
            assert kv.num_host_token_blocks(rid) == held, f"{rid}: host prefix miscounted"
    assert kv.host_running <= set(kv.tables), "host-running request without a table"
    assert kv.num_slots == {rid: len(t.block_ids[0]) * kv.block_size
                            for rid, t in kv.tables.items()}, "slot counts"
    assert kv.num_dropped_token_blocks == sum(
        t.num_dropped_blocks for t in kv.tables.values()), "dropped-block count"
    for h in kv.hooks:
        gpu_owned += h.owned_device_blocks()
    kv.gpu.check_integrity(gpu_owned)
    kv.host.check_integrity(host_owned)
    if kv.prefix_cache is not None:
        kv.prefix_cache.check_integrity(kv)
    if kv.hidden is not None:
        kv.hidden.check_integrity()
        assert set(kv.hidden.ids) <= set(kv.tables), "hidden blocks of a freed request"

