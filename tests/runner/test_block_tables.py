"""The runner's block tables: plan diffs reproduce the scheduler's tables, host and device."""

import random

import numpy as np
import torch

from kvtier.core.plan import ScheduledRequest
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.staging import PinnedStaging
from kvtier.sampling_params import SamplingParams

P = SamplingParams()
UPLOAD = PinnedStaging(torch.device("cpu")).put  # the runner's uploads, on the CPU


def sr(rid, blocks, reset):
    return ScheduledRequest(rid, [1], 0, blocks, reset, True, P, 0)


def test_diffs_and_resets_match_a_reference_on_host_and_device():
    rng = random.Random(0)
    bt = BlockTables(num_groups=2, max_reqs=4, max_blocks_per_req=12, device=torch.device("cpu"))
    ref: dict[str, list[list[int]]] = {}
    for _ in range(200):
        rid = f"r{rng.randint(0, 5)}"
        if rid not in bt.row_of and len(bt.row_of) == 4:
            continue
        if rng.random() < 0.1 and rid in bt.row_of:
            bt.remove(rid)
            ref.pop(rid)
            continue
        reset = rid not in ref or rng.random() < 0.2
        have = 0 if reset else len(ref[rid][0])
        k = rng.randint(0, min(3, 12 - have))
        new = tuple(tuple(rng.randint(0, 999) for _ in range(k)) for _ in range(2))
        if reset:
            ref[rid] = [list(g) for g in new]
        else:
            for g in range(2):
                ref[rid][g] += new[g]
        bt.apply(sr(rid, new, reset))
        bt.sync_device(UPLOAD)
        for r, groups in ref.items():
            row, n = bt.row_of[r], len(groups[0])
            assert bt.num_blocks[row] == n
            want = np.array(groups, dtype=np.int32).reshape(2, n)
            assert (bt.table[:, row, :n] == want).all()
            dev = bt.gather_device(torch.tensor([row]), n)[:, 0].numpy()
            assert (dev == want).all()


def test_apply_all_equals_apply_one_by_one():
    """The batched step path (no new block / one new block / the rest) writes exactly what
    `apply` writes request by request, on the host and the device mirror."""
    rng = random.Random(1)
    dev = torch.device("cpu")
    batched = BlockTables(num_groups=3, max_reqs=6, max_blocks_per_req=40, device=dev)
    single = BlockTables(num_groups=3, max_reqs=6, max_blocks_per_req=40, device=dev)
    have: dict[str, int] = {}
    for _ in range(150):
        step = []
        for rid in rng.sample([f"r{i}" for i in range(8)], rng.randint(1, 6)):
            if rid not in have and len(have) == 6:
                continue
            reset = rid not in have or rng.random() < 0.1
            base = 0 if reset else have[rid]
            k = min(rng.choice([0, 0, 1, 1, 2]), 40 - base)
            new = tuple(tuple(rng.randint(0, 999) for _ in range(k)) for _ in range(3))
            have[rid] = base + k
            step.append(sr(rid, new, reset))
        assert batched.apply_all(step) == [single.apply(s) for s in step]
        batched.sync_device(UPLOAD)
        single.sync_device(UPLOAD)
        assert (batched.table == single.table).all()
        assert (batched.num_blocks == single.num_blocks).all()
        assert torch.equal(batched.device_table, single.device_table)
        if rng.random() < 0.2 and have:
            gone = rng.choice(sorted(have))
            batched.remove(gone)
            single.remove(gone)
            del have[gone]


def test_host_batch_launches_decodes_longest_first():
    """The decode rows' launch order: every decode row once, longest context first (ties in
    row order), the prefill row left out."""
    from kvtier.runner.host_batch import build_host_batch

    bt = BlockTables(num_groups=1, max_reqs=8, max_blocks_per_req=16)
    starts = [40, 3, 200, 40, 17]
    plan = [ScheduledRequest(f"d{i}", [1], s, ((i,),), True, True, P, 1)
            for i, s in enumerate(starts)]
    plan.append(ScheduledRequest("p", [1] * 30, 0, ((7, 8),), True, True, P, 0))
    batch = build_host_batch(plan, bt, block_size=16)
    assert batch.num_decodes == 5
    assert batch.decode_order.dtype == np.int32
    assert batch.decode_order.tolist() == [2, 0, 3, 4, 1]
