"""The shared placement "running, KV in host memory" (kvtier/policies/host_resident/): the
KV manager's host-running requests and their host blocks, NEO's move rule (newest decodes
out when short, oldest back below the swap-in fraction, never both in one step), the
refusal of a move the host pool cannot hold for the request's life, and the step's host
rows leading the plan."""

from __future__ import annotations

import pytest

from kvtier.core.plan import ScheduledRequest
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.map_table import Placement
from kvtier.policies.directkv import DirectKVPolicy, ZeroCopyRowsItem
from kvtier.policies.host_resident import HostResidentOptions, MoveToDevice, MoveToHost
from kvtier.sampling_params import SamplingParams


def running_decode(kv: KVCacheManager, rid: str, prompt_len: int = 8,
                   max_tokens: int = 4) -> Request:
    """A running request whose prompt is computed and whose next step decodes one token."""
    req = Request(rid, list(range(prompt_len)), SamplingParams(max_tokens=max_tokens),
                  max_tokens=max_tokens)
    assert kv.allocate_slots(req, prompt_len) is not None
    req.num_computed_tokens = prompt_len
    req.output_token_ids.append(7)
    req.status = RequestStatus.RUNNING
    return req


def decode_of(req: Request) -> ScheduledRequest:
    return ScheduledRequest(req.request_id, [7], req.num_computed_tokens, ((),), False, True,
                            req.sampling_params, 1)


@pytest.fixture
def setup():
    # 2 layer groups, blocks of 4 tokens: each request holds 2 token blocks x 2 groups.
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=20, num_host_blocks=40,
                        watermark=0.0)
    running = [running_decode(kv, f"r{i}") for i in range(4)]
    policy = DirectKVPolicy(HostResidentOptions(max_model_len=64))
    return kv, running, policy


def test_short_device_pool_moves_the_newest_decodes_to_the_host(setup):
    kv, running, policy = setup
    # 16 blocks used, 4 free; each decode's next token starts a block in both groups: 8
    # needed. Moving r3 frees its 4, and its own 2 are no longer needed: it is enough.
    policy.before_step(running, kv)
    assert kv.host_running == {"r3"}
    assert [r.request_id for r in running] == ["r3", "r0", "r1", "r2"]  # host rows lead
    table = kv.tables["r3"]
    assert all(p is Placement.HOST for pls in table.placements for p in pls)
    kv.check_integrity()
    # Its next block comes from the host pool.
    host_free = kv.host.num_free
    new = kv.allocate_slots(running[0], 1)
    assert new is not None and kv.host.num_free == host_free - 2
    assert all(p is Placement.HOST for pls in table.placements for p in pls)
    kv.check_integrity()
    items = policy.take_items([decode_of(r) for r in running])
    store, rows = items
    assert isinstance(store, MoveToHost) and store.request_id == "r3" and store.count == 4
    # The table at the move: its host ids, before the new block.
    assert store.table == tuple(ids[:2] for ids in kv.block_table(running[0]))
    assert all(b < kv.host.num_blocks for ids in store.table for b in ids)
    assert isinstance(rows, ZeroCopyRowsItem) and rows.request_ids == ("r3",)
    assert rows.count == 9  # its context: 8 tokens + the new one


def test_they_come_back_oldest_first_below_the_swap_in_fraction(setup):
    kv, running, policy = setup
    policy.before_step(running, kv)
    policy.take_items([])
    for r in [r for r in running if r.request_id in ("r0", "r1")]:
        kv.free(r)
        running.remove(r)
    policy.before_step(running, kv)  # 4 used, r2 takes 2: r3's 4 + 2 fit, 10 < 0.95 x 20
    assert kv.host_running == set()
    (load,) = policy.take_items([decode_of(r) for r in running])
    assert isinstance(load, MoveToDevice) and load.request_id == "r3" and load.count == 4
    assert all(p is Placement.GPU for pls in kv.tables["r3"].placements for p in pls)
    kv.check_integrity()
    assert policy.num_moved_out == 1 and policy.num_moved_in == 1


def test_never_out_and_in_in_one_step(setup):
    kv, running, policy = setup
    policy.before_step(running, kv)
    policy.take_items([])
    policy.before_step(running, kv)  # 8 free, r0..r2 take 6: no room for r3's 6
    assert "r3" in kv.host_running
    assert not any(isinstance(i, MoveToDevice) for i in policy.take_items([]))


def test_a_host_pool_too_small_for_the_requests_life_refuses_the_move():
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=20, num_host_blocks=5,
                        watermark=0.0)
    # r3 would need 2 groups x ceil((8 + 4) / 4) = 6 host blocks over its life: only 5.
    running = [running_decode(kv, f"r{i}") for i in range(4)]
    policy = DirectKVPolicy(HostResidentOptions(max_model_len=64))
    policy.before_step(running, kv)
    assert kv.host_running == set() and kv.host.num_used == 0
    assert policy.num_refused == 1 and policy.take_items([]) == []
    kv.check_integrity()


def test_host_rows_that_do_not_lead_the_step_are_an_error(setup):
    kv, running, policy = setup
    policy.before_step(running, kv)
    with pytest.raises(RuntimeError, match="lead"):
        policy.take_items([decode_of(r) for r in running[1:]] + [decode_of(running[0])])


def test_integrity_catches_a_device_block_of_a_host_running_request(setup):
    kv, running, policy = setup
    kv.host_running.add("r0")  # claimed host-running, but its blocks are on the device
    with pytest.raises(AssertionError, match="host pool"):
        kv.check_integrity()


@pytest.mark.parametrize("fraction,back", [(0.6, ["r3"]), (0.95, ["r3", "r4"])])
def test_neos_rule_brings_them_back_fcfs_below_the_fraction(fraction, back):
    """NEO's scheduler: host-running requests come back oldest first (by arrival, not by
    when they left) while the device pool stays below `swap_in_fraction` of its blocks."""
    from kvtier.policies.neo import NeoOptions, NeoPolicy

    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=20, num_host_blocks=40,
                        watermark=0.0)
    running = [running_decode(kv, f"r{i}") for i in range(5)]  # the pool full
    policy = NeoPolicy(NeoOptions(swap_in_fraction=fraction, max_model_len=64))
    policy.before_step(running, kv)  # 10 blocks short: r4 out, then r3 (newest first)
    assert [i.request_id for i in policy.take_items([])] == ["r4", "r3"]
    for r in [r for r in running if r.request_id in ("r0", "r1")]:
        kv.free(r)
        running.remove(r)
    # r2 holds 4 and grows by 2; each comes back with 6: r3 to 10 used, r4 to 14 (>= 12).
    policy.before_step(running, kv)
    loads = policy.take_items([decode_of(r) for r in running])
    assert [i.request_id for i in loads if isinstance(i, MoveToDevice)] == back
    assert kv.host_running == {"r3", "r4"} - set(back)
    kv.check_integrity()
