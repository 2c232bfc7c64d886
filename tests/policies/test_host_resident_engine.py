"""NEO and DirectKV end to end on the CPU (fp32, tiny-llama, the torch references): under a
device pool too small for the batch, requests run from the host pool, and the greedy outputs
equal a GPU-only run's (a pool that never runs short); the KV manager's integrity holds after
every step; a host pool too small for any request's life refuses every move and the run
still completes (by recompute); the simulator runs both and prices their host rows."""

from __future__ import annotations

import dataclasses
import gc
import random
import weakref

import pytest

from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.policies.directkv import DirectKVOptions
from kvtier.policies.neo import NeoOptions
from kvtier.sampling_params import SamplingParams
from kvtier.sim.engine import build_sim_engine

# tiny-llama (4 layers, F = 4: one layer group): 16 blocks of 16 tokens hold ~4 requests.
CAPPED = dict(model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
              num_gpu_blocks=16, num_host_blocks=64, max_model_len=256,
              max_num_batched_tokens=96, max_num_seqs=8)
# The balances lifted: these tests force host placement to test the mechanism, and priced
# as the H200 runs them no move would pay on tiny-llama (tests/policies/test_*balance.py).
LIFTED = {"neo": {"neo_cpu_balance": 0.0}, "directkv": {"directkv_balance": 0.0}}
PARAMS = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True, detokenize=False)


def prompts(n: int = 8) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 4000) for _ in range(rng.randint(20, 60))] for _ in range(n)]


def run(policy: str, **overrides) -> tuple[dict[str, list[int]], LLMEngine, int]:
    """Outputs by id, the engine, and the steps that had host rows; integrity every step."""
    engine = LLMEngine.from_engine_args(EngineArgs(
        kv_policy=policy, **{**CAPPED, **LIFTED.get(policy, {}), **overrides}))
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS)
    outputs: dict[str, list[int]] = {}
    host_steps = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        engine.check_integrity()
        host_steps += bool(engine.scheduler.kv.host_running)
    assert engine.scheduler.kv.all_free()
    return outputs, engine, host_steps


def record_layouts(monkeypatch) -> list:
    """The host rows' layout of every step that has some, as the runner's source makes it."""
    from kvtier.policies.host_resident.runner_side import HostResidentSource

    layouts: list = []
    for_step = HostResidentSource.for_step

    def recorded(self, *a, **kw):
        rows = for_step(self, *a, **kw)
        if rows is not None:
            layouts.append(rows.layout)
        return rows

    monkeypatch.setattr(HostResidentSource, "for_step", recorded)
    return layouts


@pytest.fixture(scope="module")
def gpu_only() -> dict[str, list[int]]:
    outputs, engine, _ = run("recompute", num_gpu_blocks=256)
    assert engine.get_stats().num_preemptions_total == 0
    return outputs


@pytest.mark.parametrize("policy", ["neo", "directkv"])
def test_greedy_outputs_equal_gpu_only_with_requests_run_from_the_host(policy, gpu_only):
    outputs, engine, host_steps = run(policy)
    placement = engine.scheduler.policy
    assert placement.num_moved_out > 0 and host_steps > 5, "the cap must force host placement"
    assert placement.num_moved_in > 0
    assert outputs == gpu_only


@pytest.mark.parametrize("policy", ["neo", "directkv"])
def test_several_layer_groups_give_row_major_step_tables(policy, gpu_only, monkeypatch):
    """With F = 2 (two layer groups) the step's per-group slots and tables are C-ordered:
    the GPU's KV write and attention read a group's row as a flat array."""
    layouts = record_layouts(monkeypatch)
    outputs, _, _ = run(policy, layers_per_block=2, num_gpu_blocks=32, num_host_blocks=128)
    assert layouts and all(lay.tables.shape[0] == 2 for lay in layouts)
    assert all(lay.slots.flags.c_contiguous and lay.tables.flags.c_contiguous
               for lay in layouts)
    assert outputs == gpu_only


@pytest.mark.parametrize("policy", ["neo", "directkv"])
def test_a_host_pool_too_small_refuses_every_move_and_the_run_completes(policy, gpu_only):
    # 2 host blocks: no request's life (>= 3 blocks of 16 tokens) fits.
    outputs, engine, host_steps = run(policy, num_host_blocks=2)
    placement = engine.scheduler.policy
    assert placement.num_refused > 0 and placement.num_moved_out == 0 and host_steps == 0
    assert engine.get_stats().num_preemptions_total > 0  # the scheduler recomputed instead
    assert outputs == gpu_only


@pytest.mark.parametrize("policy,kind", [("neo", "neo_cpu_rows"),
                                         ("directkv", "directkv_rows")])
def test_the_simulator_runs_it_and_prices_its_host_rows(policy, kind):
    args = EngineArgs(kv_policy=policy, **{**CAPPED, **LIFTED[policy], "device": "auto",
                                           "dtype": "auto"})
    engine = build_sim_engine(args, "h200", record_steps=True)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS)
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    steps = [s for s in engine.executor.steps if s.shape.items]
    kinds = {k for s in steps for k, _ in s.shape.items}
    assert {kind, "host_resident_store", "host_resident_load"} <= kinds
    assert all(s.cost.parts["items"] > 0 for s in steps)


@pytest.mark.parametrize("policy,flags", [("neo", {}), ("neo", {"neo_pipeline": "on"}),
                                          ("neo", {"neo_pipeline": "off"}),
                                          ("neo", {"neo_pipeline": "off", "neo_graphs": False}),
                                          ("neo", {"neo_host_admission": True}),
                                          ("directkv", {}),
                                          ("directkv", {"directkv_partial_moves": True}),
                                          ("directkv", {"directkv_partial_moves": True,
                                                        "directkv_host_admission": True})])
def test_the_simulator_makes_the_real_engines_decisions(policy, flags, monkeypatch):
    """tests/sim/test_equivalence.py's check (same batches, preemptions, copies, step for
    step), with the host moves compared too (DirectKV's partial moves too)."""
    import tests.sim.test_equivalence as eq

    moves: list[list[tuple]] = []
    decision = eq.decision

    def with_moves(plan):  # each step's moves beside the decisions the check compares
        moves[-1].append(tuple((i.kind, i.request_id, i.copies) for i in plan.items
                               if hasattr(i, "copies")))
        return decision(plan)

    monkeypatch.setattr(eq, "decision", with_moves)
    base_args = eq.args
    monkeypatch.setattr(eq, "args", lambda p, h: dataclasses.replace(
        base_args(p, h), **LIFTED.get(p, {}), **flags))
    moves.append([])
    jobs, real_plans, real_out, _ = eq.real_run(policy, 64, 0)
    real_moves = moves[-1][-len(real_plans):]  # the reference pass's (real_run runs two)
    lengths = {rid: len(toks) for rid, toks in real_out.items()}
    sim = build_sim_engine(eq.args(policy, 64), "h200", output_lens=lengths)
    moves.append([])
    sim_plans, sim_out, _ = eq.drive(sim, [eq.Job(j.step, j.rid, j.prompt, SamplingParams(
        temperature=0.0, max_tokens=j.params.max_tokens, detokenize=False)) for j in jobs])
    assert any(real_moves), "the workload must move requests to the host"
    assert {rid: len(t) for rid, t in sim_out.items()} == lengths
    assert sim_plans == real_plans and moves[-1] == real_moves


# Each system's balance factor: (policy, its flag's dest, the options field, another system).
BALANCES = [("neo", "neo_cpu_balance", "cpu_balance", "directkv"),
            ("directkv", "directkv_balance", "balance", "neo")]
OPTIONS = {"neo": NeoOptions, "directkv": DirectKVOptions}


@pytest.mark.parametrize("policy,dest,field,other", BALANCES)
def test_balance_zero_lifts_the_limit(policy, dest, field, other, gpu_only):
    outputs, engine, host_steps = run(policy, **{dest: 0.0})
    placement = engine.scheduler.policy
    assert placement.options.balance_rule is None and placement.num_refused_by_system == 0
    assert placement.num_moved_out > 0 and host_steps > 5
    assert outputs == gpu_only


@pytest.mark.parametrize("policy,dest,field,other", BALANCES)
def test_the_balance_flag_parses_and_bad_values_are_refused(policy, dest, field, other):
    flag = "--" + dest.replace("_", "-")
    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", policy,
                                    flag, "0.5"])
    options = EngineArgs.from_cli_args(ns).create_engine_config().policy_options
    assert isinstance(options, OPTIONS[policy]) and getattr(options, field) == 0.5
    default = EngineArgs(model="tiny-llama", kv_policy=policy).create_engine_config()
    assert getattr(default.policy_options, field) == 1.0
    with pytest.raises(ConfigError, match=flag):
        EngineArgs(model="tiny-llama", kv_policy=policy, **{dest: -1.0}).create_engine_config()
    with pytest.raises(ConfigError, match=flag):
        EngineArgs(model="tiny-llama", kv_policy=other, **{dest: 0.5}).create_engine_config()


def test_directkv_graph_rows_attend_as_the_step_rows(gpu_only, monkeypatch):
    """The host rows a decode graph replays (directkv/graph_rows.py: their tables at a
    request's full width in buffers refilled each step, one object per row count) attend
    as the step's own rows do: here every step's host rows run through them, on the CPU."""
    from kvtier.policies.directkv.runner_side import DirectKVSource

    attention = DirectKVSource.attention
    by_count: dict[int, object] = {}

    def through_graph_rows(self, layout):
        rows = self.graph_rows(attention(self, layout))
        assert rows is not None and rows.layout is None
        assert by_count.setdefault(layout.num_rows, rows) is rows
        return rows

    monkeypatch.setattr(DirectKVSource, "attention", through_graph_rows)
    outputs, _, host_steps = run("directkv")
    assert host_steps > 0 and by_count and outputs == gpu_only


@pytest.mark.gpu
@pytest.mark.parametrize("policy,flags", [("neo", {}), ("neo", {"neo_pipeline": "on"}),
                                          ("neo", {"neo_pipeline": "on", "neo_flagged_pipeline": True}),
                                          ("neo", {"neo_pipeline": "on", "neo_graphs": False}),
                                          ("neo", {"neo_pipeline": "off"}),
                                          ("neo", {"neo_pipeline": "off", "neo_graphs": False}),
                                          ("directkv", {}),
                                          ("directkv", {"directkv_side_stream": False}),
                                          ("directkv", {"directkv_graphs": False}),
                                          ("directkv", {"directkv_partial_moves": True}),
                                          ("directkv", {"directkv_partial_moves": True,
                                                        "directkv_graphs": False})])
def test_on_the_gpu_greedy_outputs_equal_gpu_only_in_fp32(policy, flags):
    """The GPU path: DirectKV's rows through its zero-copy kernel inside the full-model decode
    graphs (decode-only steps) and on a side stream beside the backend's own rows (steps with
    prefills; in line without it; and with no graphs), with partial moves (rows with a device
    suffix, read by the same kernel from the device pool and merged), NEO's through the C++
    kernel on its own thread (by its rule, every step pipelined, none; the sequential
    decode-only steps inside the decode graphs and the pipelined steps' batch 1, handing
    each layer to one CPU job a step through pinned flags, or not), the outputs coming back
    through the pinned staging buffer without a wait."""
    reference, _, _ = run("recompute", device="cuda", num_gpu_blocks=256)
    outputs, engine, host_steps = run(policy, device="cuda", **flags)
    assert host_steps > 0 and outputs == reference
    replays = engine.executor.graphs.num_external_replays
    if policy == "neo" and "neo_pipeline" in flags:  # auto mixes the step kinds
        graphed = flags["neo_pipeline"] == "off" and flags.get("neo_graphs", True)
        assert (replays > 0) is graphed
        steps = engine.executor.external._graph_steps  # the flags' hand-over, when used
        flagged = flags.get("neo_graphs", True) and (flags["neo_pipeline"] == "off"
                                                     or flags.get("neo_flagged_pipeline", False))
        assert (steps is not None and steps.handoff.epoch > 0) is flagged
        if steps is not None:
            assert int(steps.handoff.error[0]) == 0
    if policy == "directkv":
        side = engine.executor.external.side
        assert (side is not None) is flags.get("directkv_side_stream", True)
        assert (replays > 0) is flags.get("directkv_graphs", True)


@pytest.mark.gpu
def test_a_closed_neo_engine_frees_its_host_pool_without_the_collector():
    """The graph steps' objects hold the pinned pages but no cycle: closing the engine frees
    the pool at once (a following engine pins its own; a second pool of long contexts does
    not fit beside the first)."""
    gc.disable()
    try:
        _, engine, host_steps = run("neo", device="cuda", neo_pipeline="off")
        assert host_steps > 0 and engine.executor.graphs.num_external_replays > 0
        pool = weakref.ref(engine.executor.host_kv)
        engine.close()
        del engine
        assert pool() is None
    finally:
        gc.enable()
