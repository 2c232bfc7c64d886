"""eLLM's engine-level pricing: the per-step recompute budget and the planner, built once
the pools (and, where there is one, the cost model) are known."""

from __future__ import annotations

from dataclasses import replace

from kvtier.config import ConfigError, EngineConfig
from kvtier.policies.ellm.options import ellm_options


def with_step_budget(config: EngineConfig, hw=None, cost_model=None,
                     decode_graphs: bool = False) -> EngineConfig:
    """The per-step recompute budget (EllmOptions.recompute_budget) priced for this
    engine: the ridge point of `hw` (default the H200's measured ceilings, as the planner's),
    or the cost model's price (planner/step_budget.py). The simulator passes the cost model
    it runs on. `auto`: the cost model's price when it is calibrated; else the ridge rule if
    decode steps run eagerly (`decode_graphs` False: CPU, --enforce-eager); else nothing —
    recomputing anything turns a decode step's full CUDA-graph replay into a piecewise
    step, a price the roofline cannot see (on the calibrated H200 it exceeds the cost rule's
    tolerance at all but the largest decode batches)."""
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.policies.ellm.planner.step_budget import (
        CostBudget,
        FixedBudget,
        RidgeBudget,
        StepBudget,
        ridge_tokens,
    )

    if config.kv_policy != "ellm":
        return config
    opts = ellm_options(config.policy_options)
    rule, cap, bs = opts.recompute_budget, opts.max_recompute_tokens, config.cache.block_size
    if rule == "auto":
        if cost_model is not None and cost_model.calib is not None:
            rule = "cost"
        else:
            rule = 0 if decode_graphs else "ridge"
    budget: StepBudget
    if rule == "cost":
        if cost_model is None:
            raise ConfigError("--ellm-recompute-budget cost needs --ellm-calibration")
        budget = CostBudget(cost_model, bs, cap, opts.recompute_tolerance,
                            host_groups=opts.prefix_host_groups)
    elif rule == "ridge":
        budget = RidgeBudget(ridge_tokens(hw or get_hardware("h200")), bs, cap)
    else:
        budget = FixedBudget(cap if rule == "max" else min(cap, int(rule)))
    return config.with_(policy_options=replace(opts, step_budget=budget))


def with_planner(config: EngineConfig, args, kv_bytes: int, hw=None, cost_model=None,
                 plan_for=None) -> EngineConfig:
    """Planned mode: the planner sees the pool just sized. Its roofline uses `hw`, by
    default the H200's measured ceilings (the only GPU measured here); given a calibrated
    `cost_model` (`--ellm-calibration`, or the simulator's `--calibration`), its
    efficiencies and overheads are fitted to it (planner/fit.py). `plan_for`: other
    ceilings to plan with after the fit (the planner-constants sensitivity experiment).
    `args`: EllmArgs or EngineArgs (its TPOT SLO)."""
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.policies.ellm.options import EllmArgs
    from kvtier.policies.ellm.planner.fit import fit_to_cost_model
    from kvtier.policies.ellm.planner.request_level import PlannerConfig, RequestLevelPlanner

    if config.kv_policy != "ellm":
        raise ConfigError("--ellm-planner needs --kv-policy ellm")
    slo_ms = args.tpot_slo_ms if isinstance(args, EllmArgs) else args.ellm_tpot_slo_ms
    hw = hw or get_hardware("h200")
    opts = ellm_options(config.policy_options)
    cfg = PlannerConfig(
        hbm_bytes_per_s=hw.hbm_bytes_per_s, bf16_flops=hw.bf16_flops, kv_budget_bytes=kv_bytes,
        tpot_slo_s=slo_ms / 1e3, max_batch=config.scheduler.max_num_seqs,
        max_uncached_ratio=opts.max_uncached_ratio,
        layers_per_block=config.cache.layers_per_block,
        host_groups=opts.prefix_host_groups, copy_window=opts.prefix_copy_window)
    if cost_model is not None:
        cfg = fit_to_cost_model(config.model_config, cfg, cost_model,
                                config.scheduler.max_num_batched_tokens)
    if plan_for is not None:
        cfg = replace(cfg, hbm_bytes_per_s=plan_for.hbm_bytes_per_s, bf16_flops=plan_for.bf16_flops)
    planner = RequestLevelPlanner(config.model_config, cfg)
    return config.with_(policy_options=replace(opts, planner=planner))
