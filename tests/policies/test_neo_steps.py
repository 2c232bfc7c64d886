"""NEO's steps priced as they run (kvtier/policies/neo/steps.py): a pipelined step costs less
than the sequential one and no less than either side alone; the plan's mark decides the
price in the simulator, and the mark is the choice the policy's predictor makes from the
same prices (neo/modes.py): sequential, pipelined, or GPU-only."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.policies.neo import price_cpu_rows
from kvtier.policies.neo.modes import ModeChoice
from kvtier.policies.neo.pipeline import PipelineRule
from kvtier.policies.neo.steps import StepMode, StepPrices, linear_only, replays_a_graph
from kvtier.sim import build_sim_engine, run_simulation


@pytest.fixture(scope="module")
def cm():
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, CostModelConfig
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    return CostModel(mc, get_hardware("h200"), None, CostModelConfig(block_bytes=1 << 20))


def step(cpu_rows: int, cpu_ctx: int, gpu_rows: int, gpu_ctx: int, prefill: int) -> StepShape:
    """CPU decodes first, then GPU decodes, then one prefill; every row samples."""
    n = cpu_rows + gpu_rows
    return StepShape(num_decodes=n, decode_ctx_sum=cpu_rows * cpu_ctx + gpu_rows * gpu_ctx,
                     decode_ctx_max=max(cpu_ctx, gpu_ctx), prefills=((prefill, 0),),
                     num_sampled=n + 1)


def marked(shape: StepShape, rows: int, tokens: int, mark: str) -> StepShape:
    return replace(shape, items=(("neo_cpu_rows", tokens), (mark, rows)))


@pytest.mark.parametrize("cpu_ctx", [512, 16384])  # the CPU hidden, the CPU sticking out
def test_a_pipelined_step_costs_less_than_sequential_and_no_less_than_either_side(cm, cpu_ctx):
    shape, rows, tokens = step(8, cpu_ctx, 32, 1024, 2048), 8, 8 * cpu_ctx
    sequential = cm.predict(marked(shape, rows, tokens, "neo_sequential")).total_s
    pipelined = cm.predict(marked(shape, rows, tokens, "neo_pipelined")).total_s
    # The GPU side alone: every row's linear layers, the GPU decodes' attention.
    gpu = cm.predict(replace(shape, decode_ctx_sum=32 * 1024 + rows)).total_s
    cpu = price_cpu_rows(cm, tokens)
    assert sequential == pytest.approx(gpu + cpu)
    assert max(gpu, cpu) <= pipelined < sequential
    # What cannot overlap: batch 1's linear layers around its CPU attention.
    assert pipelined >= cpu + cm.predict(linear_only(rows)).parts["forward"]


def test_the_launch_constant_is_paid_once_a_layer_in_a_pipelined_step_only(cm):
    """NEO's predictor charges lnch_T per layer (so does the H200's fit of its steps)."""
    shape = step(4, 2048, 16, 2048, 2048)
    free = StepPrices(cm, launch_s=0.0)
    priced = StepPrices(cm)
    layers = cm.mc.num_layers
    assert priced.seconds(shape, 4, 4 * 2048, StepMode.PIPELINED) == pytest.approx(
        free.seconds(shape, 4, 4 * 2048, StepMode.PIPELINED) + layers * priced.launch_s)
    for mode in (StepMode.SEQUENTIAL, StepMode.GPU_ONLY):
        assert priced.seconds(shape, 4, 4 * 2048, mode) == free.seconds(shape, 4, 4 * 2048, mode)
    # The rule gates by the same cost: as CPU rows are added beside an 8K prefill, the rule
    # without the launches holds for some rows more than the rule with them.
    rule_free = PipelineRule(cm, price_cpu_rows, launch_s=0.0)
    rule = PipelineRule(cm, price_cpu_rows)

    def with_cpu(n: int) -> StepShape:
        return step(n, 2048, 16, 2048, 8192)

    holds = [(rule.holds(with_cpu(n), n, n * 2048), rule_free.holds(with_cpu(n), n, n * 2048))
             for n in range(1, 161)]
    assert holds[0] == (True, True) and holds[-1] == (False, False)
    assert (False, True) in holds and (True, False) not in holds


def test_the_choice_follows_the_predicted_rate(cm):
    choice = ModeChoice(StepPrices(cm), PipelineRule(cm, price_cpu_rows))
    # Many CPU decodes whose attention a long prefill hides: pipelined.
    hidden = step(32, 256, 8, 1024, 4096)
    assert choice.best(hidden, 32, 32 * 256, gpu_only=True) is StepMode.PIPELINED
    # One long CPU decode beside a big GPU batch: waiting a step pays (GPU-only), unless
    # it may not wait; then sequential (NEO's rule refuses to pipeline it).
    lone = step(1, 32768, 128, 1024, 16)
    assert not choice.rule.holds(lone, 1, 32768)
    assert choice.best(lone, 1, 32768, gpu_only=True) is StepMode.GPU_ONLY
    assert choice.best(lone, 1, 32768, gpu_only=False) is StepMode.SEQUENTIAL
    # No GPU rows at all: nothing to run GPU-only.
    alone = StepShape(num_decodes=4, decode_ctx_sum=4 * 512, decode_ctx_max=512, num_sampled=4)
    assert choice.best(alone, 4, 4 * 512, gpu_only=True) is not StepMode.GPU_ONLY


def test_the_simulator_prices_the_policys_choice():
    """Every step with CPU decodes carries one mark; the mark is what the policy's predictor
    picks from the step's rows, and the simulator's price is that way's price."""
    # The balance lifted: pipelining pays its launch cost (0.8 ms a layer) only with more CPU
    # rows than the balance lets move here.
    args = EngineArgs(model="llama-3.1-8b", load_format="dummy", kv_policy="neo",
                      kv_cache_gb=1.0, max_model_len=2048, swap_space=8.0, max_num_seqs=256,
                      neo_cpu_balance=0.0)
    engine = build_sim_engine(args, "a10g", record_steps=True)
    rng = random.Random(0)
    reqs = [(tuple(rng.randrange(100, 30000) for _ in range(rng.randint(20, 400))),
             rng.randint(50, 400), 0.0) for _ in range(128)]
    times = run_simulation(engine, reqs)
    assert all(t.finish_s is not None for t in times)
    policy, cm = engine.scheduler.policy, engine.executor.cost_model
    choice = policy.options.choice
    assert choice is not None
    modes = []
    for s in engine.executor.steps:
        counts = dict(s.shape.items)
        marks = [k for k in ("neo_sequential", "neo_graphed", "neo_pipelined") if k in counts]
        if "neo_cpu_rows" not in counts:
            assert not marks
            continue
        (mark,) = marks
        mode = StepMode.PIPELINED if mark == "neo_pipelined" else StepMode.SEQUENTIAL
        graphed = mark == "neo_graphed"  # a sequential step is replayed as a graph ...
        if mode is StepMode.SEQUENTIAL:
            assert graphed is replays_a_graph(s.shape)  # ... exactly when decode-only
        rows, tokens = counts[mark], counts["neo_cpu_rows"]
        rows_only = replace(s.shape, num_swap_out=0, num_swap_in=0, items=())
        assert choice.best(rows_only, rows, tokens, gpu_only=False) is mode
        rest = replace(s.shape, items=tuple((k, n) for k, n in s.shape.items
                                            if not k.startswith("neo_")))
        assert s.cost.total_s == pytest.approx(
            StepPrices(cm, graphs=graphed).seconds(rest, rows, tokens, mode))
        modes.append(mark)
    assert modes.count("neo_pipelined") == policy.num_pipelined_steps > 0
    assert "neo_sequential" in modes and "neo_graphed" in modes
    assert policy.num_gpu_only_steps > 0


def test_the_forecast_seats_no_more_waiting_prompts_than_max_num_seqs():
    from kvtier.core.request import Request
    from kvtier.policies.host_resident.step_tokens import StepTokens
    from kvtier.policies.neo.modes import forecast
    from kvtier.sampling_params import SamplingParams

    def req(rid: str, prompt: int, computed: int) -> Request:
        return Request(rid, list(range(prompt)), SamplingParams(max_tokens=8), 8,
                       num_computed_tokens=computed)

    running = [req("h", 100, 100), req("g", 50, 50)]  # two decodes, "h" on the host
    waiting = [req(f"w{i}", 20, 0) for i in range(6)]

    def shape(seats):
        return forecast(running, {"h"}, waiting, StepTokens(4096), spare_blocks=10**6,
                        block_size=16, num_groups=1, seats=seats)

    unbounded, host_ctx = shape(None)
    assert host_ctx == (101,) and len(unbounded.prefills) == 6
    assert len(shape(5)[0].prefills) == 3  # 2 seats taken by the decodes
    assert len(shape(2)[0].prefills) == 0 and shape(2)[0].num_decodes == 2


def test_the_forecast_caps_prefill_chunks_as_the_scheduler_does():
    """vLLM's long-prefill controls (the engine's default threshold, one partial prefill a
    step): the first prompt's chunk is capped and the second waits, as in the scheduler."""
    from kvtier.core.request import Request
    from kvtier.engine.args import EngineArgs
    from kvtier.policies.host_resident.step_tokens import StepTokens
    from kvtier.policies.neo.modes import forecast
    from kvtier.sampling_params import SamplingParams
    from kvtier.scheduler.prefill_budget import PrefillChunker

    waiting = [Request(f"w{i}", list(range(3000)), SamplingParams(max_tokens=8), 8)
               for i in range(3)]
    capped = StepTokens(8192, PrefillChunker(threshold=2048, max_partial=1))
    shape, _ = forecast([], set(), waiting, capped, spare_blocks=10**6, block_size=16,
                        num_groups=1)
    assert shape.prefills == ((2048, 0),)
    shape, _ = forecast([], set(), waiting, StepTokens(8192), spare_blocks=10**6,
                        block_size=16, num_groups=1)
    assert shape.prefills == ((3000, 0), (3000, 0), (2192, 0))
    opts = EngineArgs(model="tiny-llama", kv_policy="neo", load_format="dummy", device="cpu",
                      swap_space=0.01).create_engine_config().policy_options
    assert (opts.long_prefill_threshold, opts.max_partial_prefills) == (2048, 1)
    assert opts.step_limits.start().admit(waiting[0]) == 2048


@pytest.mark.parametrize("threshold,max_partial", [(0, 1), (6, 1), (5, 3)])
def test_the_forecast_is_the_step_the_scheduler_makes_when_blocks_are_plenty(threshold,
                                                                             max_partial):
    """With room for every block, the forecast's decodes and prefill chunks are the
    scheduler's own, step after step of a random workload."""
    import random

    from kvtier.config import SchedulerConfig
    from kvtier.kv.manager import KVCacheManager
    from kvtier.policies import get_policy
    from kvtier.policies.host_resident.step_tokens import StepTokens
    from kvtier.policies.neo.modes import forecast
    from kvtier.scheduler.prefill_budget import PrefillChunker
    from kvtier.scheduler.scheduler import Scheduler
    from tests.scheduler.fake_executor import FakeExecutor
    from tests.scheduler.test_scheduler import request

    rng = random.Random(threshold * 10 + max_partial)
    config = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=6, max_model_len=48,
                             long_prefill_token_threshold=threshold,
                             max_num_partial_prefills=max_partial)
    kv = KVCacheManager(2, 4, 400, 8, watermark=0.0)
    sched, ex = Scheduler(config, kv, get_policy("recompute")), FakeExecutor(2, 4, 6, 12)
    compared = 0
    for step in range(80):
        if step < 30:
            for i in range(rng.randrange(3)):
                sched.add_request(request(f"r{step}.{i}", rng.randrange(2, 40), rng.randrange(1, 8)))
        step_tokens = StepTokens(24, PrefillChunker(threshold, max_partial))
        shape, _ = forecast(list(sched.running), set(), list(sched.waiting), step_tokens,
                            spare_blocks=10**6, block_size=4, num_groups=2, seats=6)
        plan = sched.schedule()
        # a decode: one token left to compute (a prompt's last one too), as the cost model
        decodes = [s for s in plan.scheduled
                   if sched.requests[s.request_id].num_tokens - s.start_pos <= 1]
        prefills = sorted((s.num_new_tokens, s.start_pos) for s in plan.scheduled
                          if s not in decodes)
        assert (shape.num_decodes, sorted(shape.prefills)) == (len(decodes), prefills)
        compared += bool(plan.scheduled)
        sched.update(plan, ex.execute(plan))
    assert compared > 25


def test_a_request_whose_last_token_is_in_flight_is_left_out_of_the_step():
    """Async scheduling: the scheduler does not schedule it again (nor charge its budget)."""
    from kvtier.core.request import Request
    from kvtier.policies.host_resident.step_tokens import StepTokens
    from kvtier.sampling_params import SamplingParams

    done = Request("done", [1, 2, 3], SamplingParams(max_tokens=2), 2)
    done.output_token_ids = [7]
    done.num_computed_tokens, done.num_pending_tokens = 4, 1
    going = Request("going", [1, 2, 3], SamplingParams(max_tokens=8), 8)
    going.num_computed_tokens = 2
    step = StepTokens(2)
    assert [(r.request_id, n) for r, n, _ in step.running([done, going])] == [("going", 1)]
    assert step.budget == 1
