"""The assembly shared by the host-resident systems: their flags become HostResidentOptions,
the runner gets the system's source of external rows, and a config the placement cannot
serve is refused before anything is allocated."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

from kvtier.config import ConfigError, EngineConfig
from kvtier.policies.base import HostPools, MemorySystem
from kvtier.policies.host_resident.options import HostResidentOptions
from kvtier.policies.options import SystemArgs

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext
    from kvtier.policies.host_resident.runner_side import HostResidentSource


@dataclass(frozen=True)
class HostResidentArgs(SystemArgs):
    """Flags every host-resident system has (each under its own prefix)."""

    swap_in_fraction: float = field(
        default=0.95, metadata={"help": "host-running requests come back (oldest first) while "
                                        "the device pool stays below this fraction of its "
                                        "blocks"})
    host_admission: bool = field(
        default=False, metadata={"help": "waiting prompts the device pool cannot take are "
                                         "admitted past it: the newest device decodes move "
                                         "to the host pool to make room (NEO's CPU "
                                         "prefills); off (the default): they wait for room"})


class HostResidentSystem(MemorySystem):
    """Subclasses name the system, its policy and flags, and build its runner source."""

    args: ClassVar[type[SystemArgs]] = HostResidentArgs

    def options(self, args: SystemArgs, config: EngineConfig) -> HostResidentOptions:
        assert isinstance(args, HostResidentArgs)
        return HostResidentOptions(**self.shared_options(args, config))

    @staticmethod
    def shared_options(args: HostResidentArgs, config: EngineConfig) -> dict[str, Any]:
        """The HostResidentOptions fields every system fills alike."""
        return {"swap_in_fraction": args.swap_in_fraction,
                "host_admission": args.host_admission,
                "chunked_prefill": config.scheduler.enable_chunked_prefill,
                "max_model_len": config.scheduler.max_model_len,
                "max_step_tokens": config.scheduler.max_num_batched_tokens,
                "max_step_seqs": config.scheduler.max_num_seqs,
                "long_prefill_threshold": config.scheduler.effective_long_prefill_threshold,
                "max_partial_prefills": config.scheduler.max_num_partial_prefills}

    def check_unused_flags(self, args: SystemArgs) -> None:
        changed = [f.name for f in fields(args) if getattr(args, f.name) != f.default]
        if changed:
            flags = ", ".join(f"--{args.dests()[n].replace('_', '-')}" for n in changed)
            raise ConfigError(f"{flags}: only for --kv-policy {self.name}")

    def host_pools(self, config: EngineConfig, ctx: AssemblyContext,
                   num_host_blocks: int) -> HostPools:
        if num_host_blocks <= 0:
            raise ConfigError(f"--kv-policy {self.name} runs requests from the host pool: "
                              "give it some (--swap-space or num_host_blocks)")
        return HostPools(num_host_blocks)

    def prepare_executor(self, executor: Any, ctx: AssemblyContext, pools: HostPools) -> None:
        if ctx.simulated:
            return  # the simulator prices the host rows' items
        executor.attach_external_attention(self.make_source(executor))

    def pricing(self, config: EngineConfig, ctx: AssemblyContext,
                calibration: str | None = None) -> Any:
        """The cost model a system's rules price with: the simulator's, else the real
        engine's own (its calibration JSON, else the hardware profile's ceilings); over
        `ctx.plan_for`'s profile alone where an experiment gives one (what a rule decides
        when it prices steps otherwise than they run: a calibration fits the simulated GPU,
        not those ceilings)."""
        from kvtier.costmodel.model import CostModel

        cm = ctx.cost_model
        if cm is not None and ctx.plan_for is None:
            return cm
        if cm is not None:
            return CostModel(cm.mc, ctx.plan_for, None, cm.config)
        from kvtier.costmodel.calibration import Calibration
        from kvtier.costmodel.hardware import get_hardware
        from kvtier.policies.registry import system_cost_config

        calib = Calibration.load(calibration) if calibration else None
        return CostModel(config.model_config, ctx.plan_for or ctx.hw or get_hardware("h200"),
                         calib, system_cost_config(config, ctx.block_bytes))

    def make_source(self, runner: Any) -> HostResidentSource:
        """The system's runner side (imported here: the rest of the package is torch-free)."""
        raise NotImplementedError
