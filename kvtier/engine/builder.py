"""Assembling an engine: config -> checks -> tokenizer -> model runner -> pools -> engine.
Every check that can fail runs before anything large is allocated."""

from __future__ import annotations

import gc
import logging
import os

from kvtier.config import ConfigError, copied_groups_in_flight
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.engine.memory import check_weights_fit, size_pools
from kvtier.kv.manager import KVCacheManager
from kvtier.model.loader import resolve_model_config
from kvtier.policies import get_policy
from kvtier.runner.device import resolve_device, resolve_dtype
from kvtier.tokenizer import load_tokenizer

log = logging.getLogger("kvtier")


def check_config(config) -> None:
    """The checks that need no device (the simulator runs them too)."""
    try:
        get_policy(config.kv_policy)
    except ValueError as e:
        raise ConfigError(str(e)) from e
    if config.load_format not in ("auto", "dummy", "safetensors"):
        raise ConfigError(f"unknown load format {config.load_format!r}")
    mc = config.model_config
    if (config.scheduler.max_model_len > mc.max_position_embeddings
            and os.environ.get("KVTIER_ALLOW_LONG_MAX_MODEL_LEN") != "1"):
        raise ConfigError(f"max_model_len {config.scheduler.max_model_len} exceeds the model's "
                          f"max_position_embeddings {mc.max_position_embeddings} (set "
                          "KVTIER_ALLOW_LONG_MAX_MODEL_LEN=1 to run past it anyway)")
    host_groups = config.policy_options.prefix_host_groups
    if host_groups:
        groups = config.cache.num_layer_groups(mc.num_layers)
        if config.kv_policy != "ellm":
            raise ConfigError("--ellm-host-groups needs --kv-policy ellm")
        if host_groups >= groups:
            raise ConfigError(f"--ellm-host-groups must be below the {groups} layer groups "
                              "(at least the first group recomputes)")
        if not config.piecewise_graphs:
            raise ConfigError("--ellm-host-groups needs the piecewise forward (its prefix rows "
                              "stop below the copied-in groups); drop --no-piecewise-graphs")
        if config.cache.swap_space_gb <= 0 and not config.cache.num_host_blocks:
            raise ConfigError("--ellm-host-groups needs a host pool (--swap-space)")


def build_engine(args: EngineArgs) -> LLMEngine:
    config = args.create_engine_config()
    check_config(config)
    mc = config.model_config
    device = resolve_device(config.device)
    dtype = resolve_dtype(config.dtype, device)
    check_weights_fit(config, device, dtype)
    _, ckpt = resolve_model_config(config.model, config.load_format)
    tokenizer = load_tokenizer(ckpt, config.tokenizer, mc.vocab_size)
    if not mc.eos_token_ids or ckpt is None:
        # Dummy weights: end-of-sequence is whatever the tokenizer we picked calls it.
        config = config.with_(model_config=_with_eos(mc, tokenizer.eos_token_ids))

    from kvtier.runner.model_runner import ModelRunner

    runner = ModelRunner(config, ckpt, device, dtype)
    peak = runner.profile_activation_peak()
    # One calibrated cost model prices eLLM's split, its recompute budget and its planner.
    cost_model = None
    if config.kv_policy == "ellm" and args.ellm_calibration:
        from kvtier.engine.memory import dtype_bytes

        cost_model = ellm_cost_model(config, args,
                                     config.cache.block_bytes(mc, dtype_bytes(dtype)))
        config = with_priced_host_groups(config, args.ellm_host_groups, cost_model)
    scratch = recompute_scratch_blocks(config)  # eLLM's M_o: from the same memory
    pools = size_pools(config, device, dtype, peak, reserved_blocks=scratch)
    num_gpu, num_host = pools.num_gpu_blocks, pools.num_host_blocks
    num_hidden = None
    if get_policy(config.kv_policy).keeps_hidden_states:
        # HCache keeps hidden states, not KV, in host memory: the swap space holds them.
        num_hidden = args.num_hidden_blocks or hidden_blocks_for(config, dtype)
        num_host = 0
        runner.allocate_hidden(num_hidden)
    runner.allocate_kv(num_gpu, num_host, scratch)
    if device.type == "cuda":
        runner.warm_up_steps()
    if args.ellm_planner:
        config = with_planner(config, args, num_gpu * pools.block_bytes, cost_model=cost_model)
    config = with_step_budget(config, cost_model=cost_model, decode_graphs=runner.use_cuda_graphs)
    kv = KVCacheManager(
        num_groups=runner.num_groups, block_size=config.cache.block_size,
        num_gpu_blocks=num_gpu, num_host_blocks=num_host, num_hidden_blocks=num_hidden,
        prefix_host_groups=config.policy_options.prefix_host_groups,
    )
    log.info("kvtier: %s on %s (%s), %d device + %d host KV blocks of %d KiB, policy %s",
             config.model, device, dtype, num_gpu, num_host,
             pools.block_bytes // 1024, config.kv_policy)
    engine = LLMEngine(config, runner, tokenizer, kv, pools.block_bytes)
    freeze_startup_objects()
    return engine


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (torch, the model, the engine) out of the
    garbage collector's sight, as vLLM does: a gen-2 collection otherwise walks it all, a
    pause of ~96 ms in a simulated serving run on the CPU against ~5 ms frozen
    (benchmarks/gpu_path/bench_gc_pauses.py, gc_pauses_cpu.json) — inside a step whose launches
    the GPU waits on, an idle GPU for that long."""
    gc.collect()
    gc.freeze()


def hidden_blocks_for(config, dtype) -> int:
    """Hidden-state blocks (every layer x block_size tokens x hidden) in the swap space."""
    from kvtier.engine.memory import GiB, dtype_bytes

    mc, bs = config.model_config, config.cache.block_size
    block_bytes = mc.num_layers * bs * mc.hidden_size * dtype_bytes(dtype)
    return max(1, int(config.cache.swap_space_gb * GiB // block_bytes))


def recompute_scratch_blocks(config) -> int:
    """Device blocks lent to dropped-prefix recomputation each step (eLLM only): enough for
    the most prefix tokens the policy lets the running requests drop."""
    if config.kv_policy != "ellm":
        return 0
    opts = config.policy_options
    sets = 1 + copied_groups_in_flight(opts.prefix_host_groups, opts.prefix_copy_window)
    return sets * -(-opts.max_recompute_tokens // config.cache.block_size)


def with_priced_host_groups(config, rule: str, cost_model):
    """`--ellm-host-groups auto` with a calibrated cost model (the real engine's
    `--ellm-calibration`, the simulator's own): the split it prices cheapest. Without one,
    the roofline's choice from create_engine_config stands."""
    from dataclasses import replace

    from kvtier.planner.layer_overlap import choose_host_groups_priced

    if rule != "auto" or config.kv_policy != "ellm" or cost_model.calib is None:
        return config
    mc, cache = config.model_config, config.cache
    h = choose_host_groups_priced(cost_model, cache.num_layer_groups(mc.num_layers),
                                  block_size=cache.block_size)
    return config.with_(policy_options=replace(config.policy_options, prefix_host_groups=h))


def ellm_cost_model(config, args: EngineArgs, block_bytes: int, hw=None):
    """The calibrated cost model (`--ellm-calibration`) that prices the real engine's
    recomputation: its recompute budget and its planner's fit (the same model
    `kvtier bench --simulate --calibration` runs, so both decide alike)."""
    from kvtier.costmodel.calibration import Calibration
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, engine_cost_config

    assert args.ellm_calibration
    return CostModel(config.model_config, hw or get_hardware("h200"),
                     Calibration.load(args.ellm_calibration),
                     engine_cost_config(config, block_bytes))


def with_step_budget(config, hw=None, cost_model=None, decode_graphs: bool = False):
    """eLLM's per-step recompute budget (PolicyOptions.recompute_budget) priced for this
    engine: the ridge point of `hw` (default the H200's measured ceilings, as the planner's),
    or the cost model's price (kvtier/planner/step_budget.py). The simulator passes the cost
    model it runs on. `auto`: the cost model's price when it is calibrated; else the ridge
    rule if decode steps run eagerly (`decode_graphs` False: CPU, --enforce-eager); else
    nothing — recomputing anything turns a decode step's full CUDA-graph replay into a
    piecewise step, a price the roofline cannot see (on the calibrated H200 it exceeds the
    1 % tolerance below ~170 decodes)."""
    from dataclasses import replace

    from kvtier.costmodel.hardware import get_hardware
    from kvtier.planner.step_budget import (
        CostBudget,
        FixedBudget,
        RidgeBudget,
        StepBudget,
        ridge_tokens,
    )

    if config.kv_policy != "ellm":
        return config
    opts = config.policy_options
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


def with_planner(config, args: EngineArgs, kv_bytes: int, hw=None, cost_model=None,
                 plan_for=None):
    """eLLM's planned mode: the planner sees the pool just sized. Its roofline uses `hw`, by
    default the H200's measured ceilings (the only GPU measured here); given a calibrated
    `cost_model` (`--ellm-calibration`, or the simulator's `--calibration`), its
    efficiencies and overheads are fitted to it
    (kvtier/planner/fit.py). `plan_for`: other ceilings to plan with after the fit (the
    planner-constants sensitivity experiment)."""
    from dataclasses import replace

    from kvtier.costmodel.hardware import get_hardware
    from kvtier.planner.fit import fit_to_cost_model
    from kvtier.planner.request_level import PlannerConfig, RequestLevelPlanner

    if config.kv_policy != "ellm":
        raise ConfigError("--ellm-planner needs --kv-policy ellm")
    hw = hw or get_hardware("h200")
    cfg = PlannerConfig(
        hbm_bytes_per_s=hw.hbm_bytes_per_s, bf16_flops=hw.bf16_flops, kv_budget_bytes=kv_bytes,
        tpot_slo_s=args.ellm_tpot_slo_ms / 1e3, max_batch=config.scheduler.max_num_seqs,
        max_uncached_ratio=config.policy_options.max_uncached_ratio,
        layers_per_block=config.cache.layers_per_block,
        host_groups=config.policy_options.prefix_host_groups,
        copy_window=config.policy_options.prefix_copy_window)
    if cost_model is not None:
        cfg = fit_to_cost_model(config.model_config, cfg, cost_model,
                                config.scheduler.max_num_batched_tokens)
    if plan_for is not None:
        cfg = replace(cfg, hbm_bytes_per_s=plan_for.hbm_bytes_per_s, bf16_flops=plan_for.bf16_flops)
    planner = RequestLevelPlanner(config.model_config, cfg)
    return config.with_(policy_options=replace(config.policy_options, planner=planner))


def _with_eos(mc, eos: tuple[int, ...]):
    from dataclasses import replace

    return replace(mc, eos_token_ids=tuple(eos))
