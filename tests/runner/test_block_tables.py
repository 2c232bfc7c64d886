"""The runner's block tables: plan diffs reproduce the scheduler's tables, host and device."""

import random

import numpy as np
import torch

from kvtier.core.plan import ScheduledRequest
from kvtier.runner.block_tables import BlockTables
from kvtier.sampling_params import SamplingParams

P = SamplingParams()


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
        bt.sync_device()
        for r, groups in ref.items():
            row, n = bt.row_of[r], len(groups[0])
            assert bt.num_blocks[row] == n
            want = np.array(groups, dtype=np.int32).reshape(2, n)
            assert (bt.table[:, row, :n] == want).all()
            dev = bt.gather_device(torch.tensor([row]), n)[:, 0].numpy()
            assert (dev == want).all()
