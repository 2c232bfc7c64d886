"""eLLM's layer-level overlap: a dropped prefix keeps its top layer groups' KV in the host
pool; each step copies it in while the prefix is recomputed through the lower groups only.
Greedy outputs must equal full caching, and every invariant must hold after every step."""

from __future__ import annotations

import random

import pytest

from kvtier import LLM, SamplingParams
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sim.engine import build_sim_engine


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 900) for _ in range(rng.randrange(20, 70))] for _ in range(n)]


def _greedy(**kw) -> list[list[int]]:
    llm = LLM("tiny-llama", load_format="dummy", max_model_len=160, num_gpu_blocks=200,
              num_host_blocks=200, **kw)
    counts = {"copied_in": 0, "truncated": 0}
    runner = llm.engine.executor
    issue, truncation = runner.copies.issue, runner._prefix_truncation

    def count_issue(gpu, host, swap_out, swap_in, deferred=None):
        counts["copied_in"] += len(swap_in)
        counts["deferred"] = counts.get("deferred", 0) + sum(
            len(cs) for later in (deferred or {}).values() for _, cs in later)
        return issue(gpu, host, swap_out, swap_in, deferred)

    def count_truncation(batch, meta):
        out = truncation(batch, meta)
        counts["truncated"] += out is not None
        return out

    runner.copies.issue, runner._prefix_truncation = count_issue, count_truncation
    outs = llm.generate([{"prompt_token_ids": p} for p in _prompts(6)],
                        SamplingParams(temperature=0.0, max_tokens=25, ignore_eos=True))
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    return [o.outputs[0].token_ids for o in outs], counts


@pytest.mark.parametrize("layers_per_block,host_groups,window,async_scheduling",
                         [(1, 1, 2, False), (1, 3, 0, False), (1, 3, 1, False),
                          (1, 3, 2, False), (2, 1, 2, False), (1, 3, 1, True)])
def test_offloaded_prefix_equals_full_caching(layers_per_block, host_groups, window,
                                              async_scheduling):
    # Windows below the copied groups: later groups' copies wait for an earlier group's
    # attention to finish reading the scratch they reuse.
    ref, _ = _greedy(layers_per_block=layers_per_block)
    out, counts = _greedy(layers_per_block=layers_per_block, kv_policy="ellm",
                          ellm_uncached_ratio=0.5, ellm_host_groups=host_groups,
                          ellm_copy_window=window, async_scheduling=async_scheduling)
    assert counts["copied_in"] > 0 and counts["truncated"] > 0  # the path ran
    assert (counts["deferred"] > 0) == (0 < window < host_groups)
    assert out == ref


def test_offloaded_prefix_under_pressure_keeps_invariants():
    rng = random.Random(3)
    eng = LLMEngine.from_engine_args(EngineArgs(
        model="tiny-llama", load_format="dummy", kv_policy="ellm", max_model_len=96,
        layers_per_block=1, num_gpu_blocks=40, num_host_blocks=24, ellm_host_groups=2,
        ellm_recompute_budget="max", max_num_batched_tokens=64))
    for i in range(8):
        eng.add_request(str(i), [rng.randint(0, 900) for _ in range(rng.randint(10, 50))],
                        SamplingParams(temperature=0.0, max_tokens=rng.randint(5, 40),
                                       ignore_eos=True))
    steps = 0
    while eng.has_unfinished_requests():
        eng.step()
        eng.check_integrity()
        steps += 1
        assert steps < 2000
    assert eng.scheduler.counters.num_prefix_recompute_tokens > 0
    assert eng.scheduler.kv.all_free()


@pytest.mark.parametrize("kw,match", [
    (dict(kv_policy="recompute", ellm_host_groups=1, layers_per_block=1), "kv-policy ellm"),
    (dict(kv_policy="ellm", ellm_host_groups=4, layers_per_block=1), "below the 4 layer"),
    (dict(kv_policy="ellm", ellm_host_groups=1, layers_per_block=1,
          piecewise_graphs=False), "piecewise"),
])
def test_offloaded_prefix_config_errors(kw, match):
    with pytest.raises(ConfigError, match=match):
        LLMEngine.from_engine_args(EngineArgs(model="tiny-llama", load_format="dummy",
                                              max_model_len=64, num_gpu_blocks=40, **kw))


def test_simulator_prices_offloaded_prefix_between_recompute_and_nothing():
    """The simulated engine runs the same plans: an offloaded prefix's step costs less than
    recomputing it through every layer and more than not having it."""
    from kvtier.costmodel.shape import StepShape

    eng = build_sim_engine(EngineArgs(model="llama-2-13b", load_format="dummy",
                                      kv_policy="ellm", ellm_host_groups="auto"))
    cm = eng.executor.cost_model
    h = eng.config.policy_options.prefix_host_groups
    base = dict(num_decodes=64, decode_ctx_sum=64 * 400, decode_ctx_max=400, num_sampled=64)
    recomputed = StepShape(**base, prefills=((256, 0),))
    offloaded = StepShape(**base, prefills=((256, 0),), num_prefix_rows=1,
                          prefix_host_groups=h, num_prefix_copy_blocks=h * 16)
    none = StepShape(**base)
    t_rec, t_off, t_none = (cm.predict(s).executor_s for s in (recomputed, offloaded, none))
    assert t_none < t_off < t_rec


def test_step_shape_records_offloaded_prefixes_and_round_trips():
    from kvtier.core.plan import RecomputePrefix, ScheduledRequest, StepPlan
    from kvtier.costmodel.shape import StepShape

    p = SamplingParams(temperature=0.0, max_tokens=4)
    plan = StepPlan(scheduled=[
        ScheduledRequest("a", [7], 40, ((), (), ()), False, True, p, 3),
        ScheduledRequest("b", [8], 20, ((), (), ()), False, True, p, 2)],
        items=[RecomputePrefix("a", list(range(32)), ((), (11, 12), (13, 14)))])
    shape = StepShape.from_plan(plan)
    assert (shape.num_prefix_rows, shape.prefix_host_groups, shape.num_prefix_copy_blocks) == (
        1, 2, 4)
    assert shape.prefills == ((32, 0),) and shape.without_prefix_rows().prefills == ()
    assert StepShape.from_json(shape.to_json()) == shape
    old = StepShape.from_plan(StepPlan(scheduled=plan.scheduled[1:]))
    assert len(old.to_json()) == 9 and StepShape.from_json(old.to_json()) == old


def test_a_narrow_copy_window_is_priced_no_faster():
    """Copies held back behind earlier groups can only start later: the same step with a
    window below the copied groups never prices below the unbounded one."""
    from kvtier.costmodel.overlap import swap_overlap_seconds

    groups = [4] * 10
    free, _ = swap_overlap_seconds(20e-3, 0.0, 0.0, groups, (8e-3, 9), window=0)
    narrow, bubble = swap_overlap_seconds(20e-3, 0.0, 0.0, groups, (8e-3, 9), window=1)
    assert free == pytest.approx(20e-3) and narrow > free and bubble > 0
