"""Assembling a simulated engine: the real config, tokenizer, KV manager and scheduler (inside
`LLMEngine`), a SimulatedExecutor in place of the model runner, a virtual clock."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import HardwareProfile, get_hardware
from kvtier.costmodel.model import CostModel, engine_cost_config
from kvtier.engine.args import EngineArgs
from kvtier.engine.builder import (
    check_config,
    freeze_startup_objects,
    hidden_blocks_for,
    with_planner,
    with_priced_host_groups,
    with_step_budget,
)
from kvtier.engine.llm_engine import LLMEngine
from kvtier.kv.manager import KVCacheManager
from kvtier.model.loader import resolve_model_config
from kvtier.policies import get_policy
from kvtier.sim.clock import VirtualClock
from kvtier.sim.executor import SimulatedExecutor
from kvtier.sim.memory import sim_pool_sizes
from kvtier.tokenizer import load_tokenizer

log = logging.getLogger("kvtier")


def build_sim_engine(
    engine_args: EngineArgs,
    hardware: str = "h200",
    calibration: str | Path | Calibration | None = None,
    num_gpus: int = 1,
    output_lens: Mapping[str, int] | None = None,
    record_steps: bool = False,
    clock: VirtualClock | None = None,
    planner_hardware: HardwareProfile | None = None,
) -> LLMEngine:
    """An LLMEngine whose executor is simulated on `hardware` (see `kvtier.sim`). Engines
    built one after another may share one `clock` (the bench runner's). With
    `--ellm-planner`, the planner plans for `planner_hardware` (default: the simulated GPU;
    a perturbed profile shows how much a wrong cost model costs)."""
    config = engine_args.create_engine_config()
    check_config(config)  # the real builder's checks that need no device
    hw = get_hardware(hardware)
    calib = Calibration.load(calibration) if isinstance(calibration, (str, Path)) else calibration
    _, ckpt = resolve_model_config(config.model, config.load_format)
    tokenizer = load_tokenizer(ckpt, config.tokenizer, config.model_config.vocab_size)
    mc = config.model_config
    if not mc.eos_token_ids or ckpt is None:  # as the real builder: dummy weights' eos
        config = config.with_(model_config=replace(mc, eos_token_ids=tuple(tokenizer.eos_token_ids)))
        mc = config.model_config
    pools = sim_pool_sizes(config, hw, num_gpus, calib)
    cache = config.cache
    hidden = get_policy(config.kv_policy).keeps_hidden_states  # as the real builder: HCache
    cost = CostModel(mc, hw, calib, engine_cost_config(config, pools.block_bytes, num_gpus))
    config = with_priced_host_groups(config, engine_args.ellm_host_groups, cost)
    kv = KVCacheManager(num_groups=cache.num_layer_groups(mc.num_layers),
                        block_size=cache.block_size, num_gpu_blocks=pools.num_gpu_blocks,
                        num_host_blocks=0 if hidden else pools.num_host_blocks,
                        num_hidden_blocks=(engine_args.num_hidden_blocks
                                           or hidden_blocks_for(config, torch.bfloat16))
                        if hidden else None,
                        prefix_host_groups=config.policy_options.prefix_host_groups)
    if engine_args.ellm_planner:  # fitted to a calibrated cost model, as the real engine's
        config = with_planner(config, engine_args, pools.num_gpu_blocks * pools.block_bytes,
                              hw, cost_model=cost if calib is not None else None,
                              plan_for=planner_hardware)
    # Priced on the simulated GPU, as the real engine's on its own.
    config = with_step_budget(config, hw, cost, decode_graphs=bool(cost.graph_sizes))
    clock = clock if clock is not None else VirtualClock()
    eos = tuple(tokenizer.eos_token_ids) + tuple(mc.eos_token_ids)
    executor = SimulatedExecutor(cost, clock, ordinary_token(eos, mc.vocab_size),
                                 eos[0] if eos else None, output_lens, record_steps,
                                 captures_hidden=hidden)
    log.info("kvtier sim: %s on %d x %s (%s), %d device + %d host KV blocks, policy %s",
             config.model, num_gpus, hw.name,
             f"calibrated on {calib.hardware}" if calib else "uncalibrated roofline",
             pools.num_gpu_blocks, pools.num_host_blocks, config.kv_policy)
    if config.scheduler.async_scheduling:
        log.warning("kvtier sim: --async-scheduling is not simulated: steps are priced one at "
                    "a time, host work included, as the synchronous engine runs them")
    engine = LLMEngine(config, executor, tokenizer, kv, pools.block_bytes, clock=clock)
    freeze_startup_objects()
    return engine


def ordinary_token(eos: tuple[int, ...], vocab_size: int) -> int:
    """A token id that ends nothing: the simulated model's every output."""
    banned = set(eos)
    return next(t for t in range(min(1000, vocab_size - 1), vocab_size) if t not in banned)
