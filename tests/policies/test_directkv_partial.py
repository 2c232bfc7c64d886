"""DirectKV's partial moves (`--directkv-partial-moves`): a move takes only the oldest token
blocks the device is short of, the request keeps a host prefix and a device suffix, grows
on the device, and its row attends over both parts merged by log-sum-exp. Checked here: the
KV manager's partial swap-out and its integrity, the placement's choice of how much moves,
the step layout of such rows, the balance pricing their host part, the merge's reference,
and end to end on the CPU (fp32) the greedy outputs equal a GPU-only run's."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.kernels.merge_attention import merge_attention_ref
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.map_table import Placement
from kvtier.policies.directkv import (
    DirectKVOptions,
    DirectKVPolicy,
    ZeroCopyRowsItem,
    ZeroCopySplitRowsItem,
)
from kvtier.policies.host_resident import MoveToDevice, MoveToHost
from kvtier.policies.host_resident.runner_side import rows_layout
from tests.policies.test_host_resident import decode_of, running_decode
from tests.policies.test_host_resident_engine import record_layouts, run


def placements(kv: KVCacheManager, rid: str) -> list[list[str]]:
    return [[p.value[0] for p in pls] for pls in kv.tables[rid].placements]


@pytest.fixture
def setup():
    # 2 layer groups, blocks of 4 tokens; r0..r3 hold 3 token blocks each (2 x 3 device
    # blocks): the whole pool of 24. Each decode's next token stays in its last block but
    # r3's, whose prompt is 12 tokens (its next token starts a 4th block).
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=24, num_host_blocks=40,
                        watermark=0.0)
    running = [running_decode(kv, f"r{i}", prompt_len=9, max_tokens=8) for i in range(3)]
    running.append(running_decode(kv, "r3", prompt_len=12, max_tokens=8))
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64, partial_moves=True, balance=0))
    return kv, running, policy


def test_a_partial_move_takes_the_oldest_blocks_the_device_is_short_of(setup):
    kv, running, policy = setup
    assert kv.gpu.num_free == 0  # r3's next token needs 2 blocks: 1 token block moves
    policy.before_step(running, kv)
    assert kv.host_running == {"r3"} and not kv.grows_on_host("r3")
    assert placements(kv, "r3") == [["h", "g", "g"], ["h", "g", "g"]]
    assert kv.num_host_token_blocks("r3") == 1 and kv.gpu.num_free == 2
    kv.check_integrity()
    # It grows on the device: its 4th block comes from the device pool.
    assert kv.allocate_slots(running[0], 1) is not None
    assert placements(kv, "r3") == [["h", "g", "g", "g"], ["h", "g", "g", "g"]]
    kv.check_integrity()
    store, rows, split = policy.take_items([decode_of(r) for r in running])
    assert isinstance(store, MoveToHost) and store.count == 2
    assert isinstance(rows, ZeroCopyRowsItem) and rows.host_tokens == (4,)
    assert rows.count == 4  # priced by its host tokens only
    assert isinstance(split, ZeroCopySplitRowsItem) and split.count == 1  # and its split


def test_the_next_shortage_moves_more_of_the_same_request_and_all_of_it_comes_back(setup):
    kv, running, policy = setup
    policy.before_step(running, kv)
    policy.take_items([])
    r3 = running[0]
    assert kv.allocate_slots(r3, 1) is not None  # its new device block
    r3.num_computed_tokens += 1
    r3.output_token_ids.append(7)
    # The pool is full again, and r2 has grown to its block's end: its next token needs a
    # new block. r3, partly on the host already, gives its next oldest token block (the
    # host prefix grows on the rows that have one), not r2.
    r2 = running[-1]
    r2.output_token_ids += [7, 7, 7]
    r2.num_computed_tokens = 12
    policy.before_step(running, kv)
    assert kv.host_running == {"r3"}
    assert placements(kv, "r3") == [["h", "h", "g", "g"], ["h", "h", "g", "g"]]
    kv.check_integrity()
    assert kv.allocate_slots(r2, 1) is not None
    policy.take_items([])
    # Room again (r0 and r1 finish): it comes back whole.
    for r in [r for r in running if r.request_id in ("r0", "r1")]:
        kv.free(r)
        running.remove(r)
    policy.before_step(running, kv)
    loads = [i for i in policy.take_items([]) if isinstance(i, MoveToDevice)]
    assert [i.request_id for i in loads] == ["r3"] and loads[0].count == 4
    assert kv.host_running == set() and kv.host.num_used == 0
    kv.check_integrity()


def test_a_whole_move_where_the_shortage_is_all_of_the_request():
    # r3's device blocks are all it has: a shortage of all of them moves it whole, and it
    # then grows on the host.
    kv = KVCacheManager(num_groups=2, block_size=4, num_gpu_blocks=8, num_host_blocks=40,
                        watermark=0.0)
    # Both decodes' next tokens start a 3rd token block: 4 blocks short of 8 in use.
    running = [running_decode(kv, "r0", prompt_len=8), running_decode(kv, "r1", prompt_len=8)]
    policy = DirectKVPolicy(DirectKVOptions(max_model_len=64, partial_moves=True, balance=0))
    policy.before_step(running, kv)
    assert kv.host_running == {"r1"} and kv.grows_on_host("r1")
    kv.check_integrity()


def test_integrity_catches_a_host_block_after_a_device_one(setup):
    kv, running, policy = setup
    policy.before_step(running, kv)
    table = kv.tables["r3"]
    table.placements[0][0], table.placements[0][1] = Placement.GPU, Placement.HOST
    table.block_ids[0][0], table.block_ids[0][1] = table.block_ids[0][1], table.block_ids[0][0]
    with pytest.raises(AssertionError, match="host prefix"):
        kv.check_integrity()


def test_the_layout_splits_each_row_at_its_host_prefix():
    bs = 4
    # Runner table of 2 groups, 3 rows (row 1 unused): row 0 a whole host row of 9 tokens,
    # row 2 two host blocks then device blocks, 14 tokens.
    table = np.full((2, 3, 5), -7, dtype=np.int32)
    table[:, 0, :3] = [[10, 11, 12], [20, 21, 22]]
    table[:, 2, :4] = [[13, 14, 100, 101], [23, 24, 200, 201]]
    rows, lens, pos = np.array([0, 2]), np.array([9, 14]), np.array([8, 13])
    lay = rows_layout(table, bs, rows, lens, pos, (9, 8))
    assert lay.context_lens.tolist() == [9, 8]
    assert lay.tables[0].tolist() == [[10, 11, 12], [13, 14, 100]]  # 3 host blocks wide
    assert lay.slots.tolist() == [[12 * bs, -1], [22 * bs, -1]]
    d = lay.device
    assert d is not None and d.lens.tolist() == [0, 6]
    assert d.tables[:, 1].tolist() == [[100, 101], [200, 201]]
    assert d.slots.tolist() == [[-1, 101 * bs + 1], [-1, 201 * bs + 1]]
    assert lay.slots.flags.c_contiguous and d.tables.flags.c_contiguous
    # Whole rows only: no device part, the layout as before partial moves.
    whole = rows_layout(table, bs, rows[:1], lens[:1], pos[:1], ())
    assert whole.device is None and whole.context_lens.tolist() == [9]


def test_the_balance_prices_the_tokens_a_partial_move_takes():
    from tests.policies.test_directkv_balance import balance, decode

    b = balance(1.0)
    running = [decode(f"d{i}", 2048, 128) for i in range(8)]
    host = decode("h", 2048, 128)  # a host row already: no first row's fixed cost
    long_lived = decode("long", 2048, 500)
    # Whole: 2,048 tokens more read over PCIe for 500 steps, against one recompute.
    assert not b.mover([host, *running, long_lived], {"h"})(long_lived)
    # One block of 16 tokens: its bytes only, 500 times.
    assert b.mover([host, *running, long_lived], {"h"})(long_lived, 16)


def test_a_row_moved_part_by_part_is_priced_by_all_of_its_host_part():
    """Each part is cheap alone; the row's host reads together are what preempting it
    would save, so the parts stop where the whole prefix no longer pays."""
    from tests.policies.test_directkv_balance import balance, decode

    b = balance(1.0)
    running = [decode(f"d{i}", 2048, 128) for i in range(8)]
    host = decode("h", 2048, 128)
    row = decode("row", 2048, 500)
    assert b.mover([host, *running, row], {"h"})(row, 16)  # alone, one block pays
    # With 1,024 of its tokens on the host already, one more block does not.
    may_move = b.mover([host, row, *running], {"h", "row"}, {"row": 1024})
    assert not may_move(row, 16)
    # Taken in one step, the first parts pay until the row's whole host part would not.
    may_move = b.mover([host, *running, row], {"h"})
    moved = 0
    while moved < 2048 and may_move(row, 16):
        moved += 16
    assert 16 <= moved < 1024


def test_merging_two_parts_equals_attention_over_the_whole():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 4, 8), torch.randn(3, 20, 8), torch.randn(3, 20, 8)

    def attend(lo, hi):
        s = torch.einsum("bhd,btd->bht", q, k[:, lo:hi]) / 8 ** 0.5
        return torch.einsum("bht,btd->bhd", s.softmax(-1), v[:, lo:hi]), s.logsumexp(-1)

    def merge(o1, lse1, o2, lse2):
        return merge_attention_ref(o1, lse1, o2, lse2, torch.empty_like(o1))

    whole, _ = attend(0, 20)
    torch.testing.assert_close(merge(*attend(0, 12), *attend(12, 20)), whole)
    empty_o, empty_lse = torch.zeros(3, 4, 8), torch.full((3, 4), -torch.inf)
    torch.testing.assert_close(merge(*attend(0, 20), empty_o, empty_lse), whole)


@pytest.fixture(scope="module")
def gpu_only() -> dict[str, list[int]]:
    outputs, _, _ = run("recompute", num_gpu_blocks=256)
    return outputs


@pytest.mark.parametrize("overrides", [{}, {"layers_per_block": 2, "num_gpu_blocks": 32,
                                            "num_host_blocks": 128}])
def test_greedy_outputs_equal_gpu_only_with_rows_split_between_the_pools(
        overrides, gpu_only, monkeypatch):
    layouts = record_layouts(monkeypatch)
    outputs, engine, host_steps = run("directkv", directkv_partial_moves=True, **overrides)
    assert host_steps > 5 and sum(lay.device is not None for lay in layouts) > 5
    assert engine.scheduler.policy.num_moved_in > 0
    assert outputs == gpu_only


def test_a_gqa_model_with_qk_norm_splits_rows_exactly(monkeypatch):
    """Qwen3's shape (grouped KV heads, q/k norms): the merge and the suffix read per KV
    group give the GPU-only run's greedy outputs too."""
    reference, _, _ = run("recompute", model="tiny-qwen3", num_gpu_blocks=256)
    layouts = record_layouts(monkeypatch)
    outputs, _, _ = run("directkv", model="tiny-qwen3", directkv_partial_moves=True)
    assert any(lay.device is not None for lay in layouts) and outputs == reference


def test_the_graph_rows_attend_device_suffixes_as_the_step_rows(gpu_only, monkeypatch):
    """Every step's rows through the decode graphs' buffers (graph_rows.py), on the CPU:
    under partial moves they carry the suffixes too, cleared where a step has none."""
    from kvtier.policies.directkv.runner_side import DirectKVSource

    attention = DirectKVSource.attention
    layouts = []

    def through_graph_rows(self, layout):
        rows = self.graph_rows(attention(self, layout))
        assert rows is not None and rows.inputs().suffix is not None
        layouts.append(layout)
        return rows

    monkeypatch.setattr(DirectKVSource, "attention", through_graph_rows)
    outputs, _, _ = run("directkv", directkv_partial_moves=True)
    assert any(lay.device is not None for lay in layouts)
    assert outputs == gpu_only


def test_the_simulator_runs_partial_moves_and_prices_the_host_tokens():
    from kvtier.engine.args import EngineArgs
    from kvtier.sim.engine import build_sim_engine
    from tests.policies.test_host_resident_engine import CAPPED, PARAMS, prompts

    args = EngineArgs(kv_policy="directkv", **{**CAPPED, "device": "auto", "dtype": "auto",
                                               "directkv_balance": 0.0,
                                               "directkv_partial_moves": True})
    engine = build_sim_engine(args, "h200", record_steps=True)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS)
    split = 0
    while engine.has_unfinished_requests():
        kv = engine.scheduler.kv
        split += any(not kv.grows_on_host(r) for r in kv.host_running)
        engine.step()
        engine.check_integrity()
    assert split > 5
    kinds = {k for s in engine.executor.steps for k, _ in s.shape.items}
    assert {"directkv_rows", "directkv_split_rows"} <= kinds


def test_the_flag_parses_is_off_by_default_and_only_for_directkv():
    from kvtier.cli import build_parser
    from kvtier.config import ConfigError
    from kvtier.engine.args import EngineArgs

    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", "directkv",
                                    "--directkv-partial-moves"])
    options = EngineArgs.from_cli_args(ns).create_engine_config().policy_options
    assert isinstance(options, DirectKVOptions) and options.partial_moves
    default = EngineArgs(model="tiny-llama", kv_policy="directkv").create_engine_config()
    assert not default.policy_options.partial_moves
    with pytest.raises(ConfigError, match="--directkv-partial-moves"):
        EngineArgs(model="tiny-llama", kv_policy="neo",
                   directkv_partial_moves=True).create_engine_config()


def test_a_part_is_priced_as_the_shortage_the_batch_will_reach():
    """8 decodes of 32K fill the device pool, and each next token starts a block: 2 token
    blocks of the newest are short now. Priced alone, that part pays against recomputing
    32K tokens; but as the batch grows to its last tokens the shortage reaches many more
    blocks, which this row would then hold on the host: the part is priced so, and refused
    (the scheduler preempts at once, no part moved that a later one would undo). A batch
    about to end moves its part."""
    from tests.policies.test_directkv_balance import balance

    bs, groups, ctx, n = 16, 8, 32768, 8

    def step(max_tokens: int):
        kv = KVCacheManager(num_groups=groups, block_size=bs, num_gpu_blocks=n * groups * ctx // bs,
                            num_host_blocks=n * groups * ctx // bs, watermark=0.0)
        running = [running_decode(kv, f"r{i}", prompt_len=ctx, max_tokens=max_tokens)
                   for i in range(n)]
        rule = balance(1.0)
        policy = DirectKVPolicy(DirectKVOptions(max_model_len=2 * ctx, partial_moves=True,
                                                balance_rule=rule))
        alone = rule.mover(running, set())(running[-1], bs)  # one block, priced alone
        policy.before_step(running, kv)
        kv.check_integrity()
        return kv, policy, alone

    kv, policy, alone = step(max_tokens=256)
    assert alone and kv.host_running == set() and policy.num_refused_by_system == 1
    kv, policy, _ = step(max_tokens=2)
    assert kv.host_running == {"r7"} and not kv.grows_on_host("r7")


def test_the_first_split_row_pays_the_split_cost_in_the_balance():
    """A part that keeps the row's device suffix makes the step's first split row: the
    balance adds the system's split price (the suffix's read and the merge) to what the
    move adds, so a part that would pay at the host reads' price alone may not."""
    import dataclasses

    from kvtier.policies.directkv import price_split_rows, price_zero_copy_rows
    from tests.policies.test_directkv_balance import balance, decode

    plain = balance(1.0)
    with_split = dataclasses.replace(plain, price_split=price_split_rows)
    cm = plain.cost_model
    first, split = price_zero_copy_rows(cm, 16), price_split_rows(cm, 1)
    remaining = int(plain.recompute_s(2048) / (first + split / 2))
    running = [decode(f"d{i}", 2048, 128) for i in range(8)]
    row = decode("row", 2048, remaining)
    assert plain.mover([*running, row], set())(row, 16)
    assert not with_split.mover([*running, row], set())(row, 16)
    assert with_split.mover([*running, row], set())(row, None) == plain.mover(
        [*running, row], set())(row, None)  # a whole move splits nothing
