"""A simulated engine: the one assembly (kvtier/engine/assembly.py) over the simulator's
factory — the real config, tokenizer, KV manager and scheduler (inside `LLMEngine`), a
SimulatedExecutor in place of the model runner, a virtual clock."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from kvtier.config import ConfigError
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import HardwareProfile, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.engine.assembly import assemble, freeze_startup_objects
from kvtier.engine.llm_engine import LLMEngine
from kvtier.offload.install import enable_host_tier
from kvtier.sim.clock import VirtualClock
from kvtier.sim.factory import SimFactory, ordinary_token

log = logging.getLogger("kvtier")

__all__ = ["build_sim_engine", "ordinary_token"]


def build_sim_engine(
    engine_args: EngineArgs,
    hardware: str | HardwareProfile = "h200",
    calibration: str | Path | Calibration | None = None,
    num_gpus: int | None = None,
    output_lens: Mapping[str, int] | None = None,
    record_steps: bool = False,
    clock: VirtualClock | None = None,
    planner_hardware: HardwareProfile | None = None,
) -> LLMEngine:
    """An LLMEngine whose executor is simulated on `hardware` (see `kvtier.sim`). Engines
    built one after another may share one `clock` (the bench runner's). A planner plans for
    `planner_hardware` (default: the simulated GPU; a perturbed profile shows how much a
    wrong cost model costs). `num_gpus`: the tensor-parallel degree priced (default: the
    args' tensor_parallel_size; the sharding is the runner's, kvtier/distributed/sharding.py)."""
    num_gpus = _num_gpus(engine_args, num_gpus)
    calib = Calibration.load(calibration) if isinstance(calibration, (str, Path)) else calibration
    hw = hardware if isinstance(hardware, HardwareProfile) else get_hardware(hardware)
    factory = SimFactory(hw, calib, num_gpus,
                         clock if clock is not None else VirtualClock(), output_lens,
                         record_steps, plan_for=planner_hardware,
                         overlap_host=bool(engine_args.async_scheduling))
    engine = LLMEngine.from_parts(assemble(engine_args, factory))
    if engine_args.host_tier.enabled:  # the index and admission; the items are priced
        enable_host_tier(engine, engine_args.host_tier)
    if engine_args.async_scheduling:
        log.info("kvtier sim: --async-scheduling prices each step's host time beside the "
                 "previous step's device time; the decisions are a synchronous engine's")
    freeze_startup_objects()
    return engine


def _num_gpus(args: EngineArgs, num_gpus: int | None) -> int:
    tp = args.tensor_parallel_size
    if num_gpus in (None, 1):  # 1: the bench's --num-gpus left at its default
        return tp
    if tp not in (1, num_gpus):
        raise ConfigError(f"--num-gpus {num_gpus} and --tensor-parallel-size {tp} disagree")
    return num_gpus
