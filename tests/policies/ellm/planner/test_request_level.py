"""The request-level planner on hand-checkable situations (llama-2-13b on H200 figures)."""

from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.presets import preset_config
from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner

M13 = model_config_from_hf(preset_config("llama-2-13b"))
GiB = 1 << 30


def planner(kv_gb: float, slo_ms: float = 100.0, max_batch: int = 256) -> RequestLevelPlanner:
    return RequestLevelPlanner(M13, PlannerConfig(
        hbm_bytes_per_s=4.24e12, bf16_flops=761e12, kv_budget_bytes=kv_gb * GiB,
        tpot_slo_s=slo_ms / 1e3, max_batch=max_batch))


def test_step_time_is_a_roofline():
    p = planner(40)
    read = (p.linear_params + p.lm_head_params) * 2  # bytes of weights a step reads
    t1 = p.step_time(1, 0.0, 512)
    assert read / 4.24e12 < t1 < 1.2 * read / 4.24e12 + 1e-3  # batch 1: weight-bound
    # Past the ridge point extra recomputed tokens cost FLOPs: 64 requests at r = 0.5 of 2048
    # recompute 65k tokens, ~1.7 PFLOP of linear work: over 2 s.
    assert p.step_time(64, 0.5, 2048) > 2.0
    # Below it they are nearly free: 8 requests dropping one 16-token block each put
    # 8 + 128 = 136 tokens through the weights, under the ~180 of the ridge point.
    assert p.step_time(8, 16 / 512, 512) < 1.15 * p.step_time(8, 0.0, 512)


def test_plenty_of_memory_caches_everything():
    d = planner(kv_gb=100).solve([600] * 100)
    assert d.feasible and d.batch == 100 and d.uncached_ratio < 0.01


def test_below_the_ridge_recompute_buys_batch():
    # 64-token contexts, KV room for 4 requests: the step is weight-bound (4 tokens), so
    # recomputed prefix tokens ride along almost free up to ~180 tokens a step, and dropping
    # half of each context doubles the batch for a small rise in step time.
    kv_gb = 4 * 64 * M13.kv_bytes_per_token(2) / GiB
    p = planner(kv_gb=kv_gb, slo_ms=100, max_batch=64)
    d = p.solve([64] * 64)
    assert d.feasible and d.uncached_ratio > 0.2 and d.batch > 4
    assert d.batch / d.step_time_s > 4 / p.step_time(4, 0.0, 64)
    assert p.memory(d.batch, d.uncached_ratio, 64) <= kv_gb * GiB * 1.001


def test_past_the_ridge_recompute_does_not_pay():
    # 1500-token contexts, KV room for ~17: recomputing even 10 % of 1500 tokens per request
    # per step puts thousands of tokens through the model each step, so the planner keeps
    # everything cached and runs the batch memory allows: the physics cap on eLLM here.
    full = int(20 * GiB // (1500 * M13.kv_bytes_per_token(2)))
    d = planner(kv_gb=20, slo_ms=200).solve([1500] * 200)
    assert d.feasible and d.uncached_ratio < 0.01 and d.batch == full


def test_slo_caps_the_batch():
    loose = planner(kv_gb=100, slo_ms=1000).solve([2000] * 256)
    tight = planner(kv_gb=100, slo_ms=30).solve([2000] * 256)
    assert tight.batch < loose.batch
    assert tight.step_time_s <= 0.030 + 1e-6


def test_infeasible_slo_is_reported():
    d = planner(kv_gb=40, slo_ms=1).solve([1000] * 10)
    assert not d.feasible and d.batch == 1


def test_a_feasible_stop_without_success_is_kept():
    # A load seen in a simulated ShareGPT run (214 requests, mean context 253.17, 40 GiB):
    # SLSQP ends at the optimum from every start with "positive directional derivative for
    # linesearch" (success False). That point is inside both bounds; before, the planner
    # reported the load infeasible and fell back to b = 1, r = r_max, dropping half of every
    # running request's KV.
    p = RequestLevelPlanner(M13, PlannerConfig(
        hbm_bytes_per_s=4.24e12, bf16_flops=761e12, kv_budget_bytes=42614128640,
        tpot_slo_s=0.1, max_batch=512, max_uncached_ratio=0.5))
    d = p.solve([253] * 213 + [290])
    assert d.feasible and d.batch > 200 and d.uncached_ratio < 0.01


def test_recompute_must_beat_the_cached_batch_by_min_gain():
    # The load of test_below_the_ridge_recompute_buys_batch: r > 0 roughly doubles the
    # batch, unless the planner demands more than that gain.
    from dataclasses import replace

    kv_gb = 4 * 64 * M13.kv_bytes_per_token(2) / GiB
    p = planner(kv_gb=kv_gb, slo_ms=100, max_batch=64)
    assert p.solve([64] * 64).uncached_ratio > 0.2
    strict = RequestLevelPlanner(M13, replace(p.cfg, min_gain=10.0))
    d = strict.solve([64] * 64)
    assert d.feasible and d.uncached_ratio == 0.0 and d.batch == 4
    # One request, room for it: dropping cannot grow the batch, so nothing is dropped.
    assert planner(kv_gb=kv_gb).solve([64]).uncached_ratio == 0.0


def test_a_failed_slsqp_falls_back_to_the_cached_batch_not_to_r_max():
    # Constants fitted to the calibrated H200 cost model (the simulated e2e run); on this
    # load every SLSQP start ended outside a bound, and the planner answered "infeasible,
    # r = 0.5" — dropping half of every running request's KV — where 187 requests fit cached.
    p = RequestLevelPlanner(M13, PlannerConfig(
        hbm_bytes_per_s=4.24e12, bf16_flops=761e12, kv_budget_bytes=42614128640,
        tpot_slo_s=0.1, max_batch=512, max_uncached_ratio=0.5, step_overhead_s=0.0022093339,
        flops_efficiency=0.7461679242, hbm_efficiency=0.8967105163,
        recompute_overhead_s=0.0025488921))
    d = p.solve([277.8125] * 192)
    assert d.feasible and d.uncached_ratio == 0.0 and d.batch == 187
    # Truly infeasible on time (the SLO below one request's step): still nothing dropped.
    tight = RequestLevelPlanner(M13, PlannerConfig(
        hbm_bytes_per_s=4.24e12, bf16_flops=761e12, kv_budget_bytes=40 * GiB, tpot_slo_s=0.001))
    d = tight.solve([512] * 8)
    assert not d.feasible and d.uncached_ratio == 0.0


def test_offloaded_prefix_groups_cheapen_the_step_and_grow_the_scratch():
    """--ellm-host-groups: the prefix recomputes only the lower groups (cheaper steps once
    recompute is past the ridge) while its copied groups need scratch of their own (M_o)."""
    from dataclasses import replace

    base = planner(40)
    cfg = replace(base.cfg, host_groups=6)  # 13B at F = 4: 10 groups, 6 copied in
    host = RequestLevelPlanner(base.m, cfg)
    assert host.recomputed_fraction == 0.4
    assert host.step_time(64, 0.0, 1000) == base.step_time(64, 0.0, 1000)
    assert host.step_time(64, 0.3, 1000) < base.step_time(64, 0.3, 1000)
    assert host.memory(64, 0.3, 1000) > base.memory(64, 0.3, 1000)
    assert host.memory(64, 0.0, 1000) == base.memory(64, 0.0, 1000)
