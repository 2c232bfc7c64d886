"""eLLM's part of assembling an engine (real or simulated): its checks, the recompute
scratch it takes from the device pool, the pricing of its host-group split, its per-step
recompute budget and its planner (kvtier/engine/assembly.py calls these hooks)."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any

from kvtier.config import ConfigError, EngineConfig
from kvtier.policies.base import HostPools, MemorySystem
from kvtier.policies.ellm.budgets import with_planner, with_step_budget
from kvtier.policies.ellm.options import (
    EllmArgs,
    EllmOptions,
    copied_groups_in_flight,
    ellm_options,
    host_groups_rule,
    resolve_options,
)
from kvtier.policies.ellm.policy import EllmPolicy
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import system_cost_config

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext


class EllmSystem(MemorySystem):
    name = "ellm"
    policy = EllmPolicy
    args = EllmArgs
    demo_order = 2

    def options(self, args, config: EngineConfig) -> EllmOptions:
        return resolve_options(args, config.model_config, config.cache, config.scheduler,
                               active=True)

    def check_unused_flags(self, args: SystemArgs) -> None:
        assert isinstance(args, EllmArgs)
        if str(args.host_groups) != "auto" and host_groups_rule(args.host_groups):
            raise ConfigError("--ellm-host-groups needs --kv-policy ellm")
        if args.planner:
            raise ConfigError("--ellm-planner needs --kv-policy ellm")

    def check(self, config: EngineConfig) -> None:
        check_host_groups(config)
        check_recompute_cap(config)

    def priced(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        args = ctx.system_args
        assert isinstance(args, EllmArgs)
        if ctx.cost_model is None and args.calibration:  # the real engine's own pricing
            ctx.cost_model = ellm_cost_model(config, args, ctx.block_bytes, ctx.hw)
        if ctx.cost_model is None:
            return config
        return with_priced_host_groups(config, args.host_groups, ctx.cost_model)

    def reserved_device_blocks(self, config: EngineConfig) -> int:
        return recompute_scratch_blocks(config)

    def cost_model_options(self, config: EngineConfig) -> dict[str, Any]:
        return {"prefix_copy_window": ellm_options(config.policy_options).prefix_copy_window}

    def kv_manager_options(self, config: EngineConfig, pools: HostPools) -> dict[str, Any]:
        return {"prefix_host_groups": ellm_options(config.policy_options).prefix_host_groups}

    def prepare_executor(self, executor: Any, ctx: AssemblyContext, pools: HostPools) -> None:
        """The runner's share of offloaded prefixes (the simulator prices them from the
        cost model's config instead)."""
        if not ctx.simulated:
            opts = executor.config.policy_options
            executor.prefix_host_groups = opts.prefix_host_groups
            executor.prefix_copy_window = opts.prefix_copy_window

    def after_pools(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        args = ctx.system_args
        assert isinstance(args, EllmArgs)
        cm = ctx.cost_model
        if args.planner:  # fitted to a calibrated cost model
            config = with_planner(config, args, ctx.num_gpu_blocks * ctx.block_bytes, ctx.hw,
                                  cost_model=cm if cm is not None and cm.calib is not None
                                  else None, plan_for=ctx.plan_for)
        return with_step_budget(config, ctx.hw, cm, decode_graphs=ctx.decode_graphs)


def check_host_groups(config: EngineConfig) -> None:
    host_groups = ellm_options(config.policy_options).prefix_host_groups
    if not host_groups:
        return
    groups = config.cache.num_layer_groups(config.model_config.num_layers)
    if host_groups >= groups:
        raise ConfigError(f"--ellm-host-groups must be below the {groups} layer groups "
                          "(at least the first group recomputes)")
    if not config.piecewise_graphs:
        raise ConfigError("--ellm-host-groups needs the piecewise forward (its prefix rows "
                          "stop below the copied-in groups); drop --no-piecewise-graphs")
    if config.cache.swap_space_gb <= 0 and not config.cache.num_host_blocks:
        raise ConfigError("--ellm-host-groups needs a host pool (--swap-space)")


def check_recompute_cap(config: EngineConfig) -> None:
    """A request's dropped prefix is recomputed in every step it runs, beside its next
    token: a prefix the step's token budget cannot hold would never be scheduled again."""
    cap = ellm_options(config.policy_options).max_recompute_tokens
    if cap >= config.scheduler.max_num_batched_tokens:
        raise ConfigError(f"--ellm-max-recompute-tokens ({cap}) must be below "
                          f"max_num_batched_tokens ({config.scheduler.max_num_batched_tokens}): "
                          "a dropped prefix is recomputed beside the request's next token")


def recompute_scratch_blocks(config: EngineConfig) -> int:
    """Device blocks lent to dropped-prefix recomputation each step: enough for the most
    prefix tokens the policy lets the running requests drop."""
    if config.kv_policy != "ellm":
        return 0
    opts = ellm_options(config.policy_options)
    sets = 1 + copied_groups_in_flight(opts.prefix_host_groups, opts.prefix_copy_window)
    return sets * -(-opts.max_recompute_tokens // config.cache.block_size)


def with_priced_host_groups(config: EngineConfig, rule: str, cost_model) -> EngineConfig:
    """`--ellm-host-groups auto` with a calibrated cost model (the real engine's
    `--ellm-calibration`, the simulator's own): the split it prices cheapest. Without one,
    the roofline's choice from create_engine_config stands."""
    from kvtier.policies.ellm.planner.layer_overlap import choose_host_groups_priced

    if rule != "auto" or config.kv_policy != "ellm" or cost_model.calib is None:
        return config
    mc, cache = config.model_config, config.cache
    h = choose_host_groups_priced(cost_model, cache.num_layer_groups(mc.num_layers),
                                  block_size=cache.block_size)
    opts = ellm_options(config.policy_options)
    return config.with_(policy_options=replace(opts, prefix_host_groups=h))


def ellm_cost_model(config: EngineConfig, args, block_bytes: int, hw=None):
    """The calibrated cost model (`--ellm-calibration`) that prices the real engine's
    recomputation: its recompute budget and its planner's fit (the same model
    `kvtier bench --simulate --calibration` runs, so both decide alike). `args`: EllmArgs
    or EngineArgs."""
    from kvtier.costmodel.calibration import Calibration
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel

    calibration = _flag(args, "calibration")
    assert calibration
    return CostModel(config.model_config, hw or get_hardware("h200"),
                     Calibration.load(calibration), system_cost_config(config, block_bytes))


def _flag(args, name: str):
    """A flag from EllmArgs (`name`) or from EngineArgs (`ellm_name`)."""
    return getattr(args, name) if isinstance(args, EllmArgs) else getattr(args, f"ellm_{name}")
