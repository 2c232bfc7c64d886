"""NEO (`--kv-policy neo`): host-running requests (kvtier/policies/host_resident/) attend on
the CPU over their KV in host memory (runner_side.py): only q, k, v and the output cross
PCIe; the KV stays put. Priced by the bytes the CPU attention reads at the host's rate."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvtier.config import ConfigError, EngineConfig, SystemOptions
from kvtier.core.items import PlanItem, register_item
from kvtier.core.plan import ScheduledRequest
from kvtier.core.request import Request
from kvtier.costmodel.hardware import CopyMechanism
from kvtier.policies.host_resident import (
    HostResidentArgs,
    HostResidentOptions,
    HostResidentPolicy,
    HostResidentSystem,
    HostRows,
    kv_bytes_per_token,
    run_rows,
)
from kvtier.policies.neo.balance import CpuBalance
from kvtier.policies.neo.pipeline import PipelineMode, PipelineRule
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import register_system

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext

# KV bytes a second the CPU attention reads on the H200 host's 16 cores (torch's SDPA there;
# shared/research/seed002_implementation_notes.md, NEO section).
CPU_ATTENTION_BYTES_PER_S = 35e9


@dataclass(frozen=True, slots=True)
class CpuRowsItem(HostRows):
    kind = "neo_cpu_rows"
    pipelined: bool = False  # the step runs as two sub-batches (neo/pipeline.py)


def price_cpu_rows(cost_model, num_context_tokens: int) -> float:
    """The CPU reads every context token's K and V of every layer once a step; per layer
    q/k/v go down and the output comes back (two small copies)."""
    read = num_context_tokens * kv_bytes_per_token(cost_model) / CPU_ATTENTION_BYTES_PER_S
    d2h = cost_model.hw.d2h[CopyMechanism.BULK]
    return read + 2 * cost_model.mc.num_layers * d2h.beta_s


@dataclass(frozen=True)
class NeoArgs(HostResidentArgs):
    prefix = "neo"
    cpu_threads: int | None = field(
        default=None, metadata={"help": "neo: threads of the CPU attention (default: torch's)"})
    pipeline: str = field(
        default="auto", metadata={"help": "neo: run steps with CPU decodes as two pipelined "
                                          "sub-batches: auto (NEO's rule, priced by the cost "
                                          "model), on, off"})
    cpu_balance: float = field(
        default=1.0, metadata={"help": "neo: a decode moves to the host only while the CPU "
                                        "attention of all host decodes stays <= this times "
                                        "the step's predicted GPU time (else the scheduler "
                                        "preempts); 0: no limit"})
    calibration: str | None = field(
        default=None, metadata={"help": "neo: calibration JSON of the cost model that prices "
                                        "the pipelining rule (default: the hardware profile)"})


@dataclass(frozen=True)
class NeoOptions(HostResidentOptions):
    cpu_threads: int | None = None
    pipeline: PipelineMode = PipelineMode.AUTO
    rule: PipelineRule | None = field(default=None, compare=False)  # set once priced
    cpu_balance: float = 1.0  # neo/balance.py's factor; 0: no limit
    max_step_tokens: int = 8192  # the scheduler's token budget (the balance's prefill chunks)
    balance: CpuBalance | None = field(default=None, compare=False)  # set once priced

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"neo: cpu_threads must be >= 1, got {self.cpu_threads}")
        if not self.cpu_balance >= 0:
            raise ConfigError(f"--neo-cpu-balance must be >= 0, got {self.cpu_balance}")


class NeoPolicy(HostResidentPolicy):
    rows_item = CpuRowsItem
    options: NeoOptions

    def __init__(self, options: SystemOptions):
        super().__init__(options if isinstance(options, NeoOptions) else NeoOptions())
        self.num_pipelined_steps = 0

    def mover(self, running: list[Request], host: set[str]):
        balance = self.options.balance
        return balance.mover(running, host) if balance is not None else None

    def take_items(self, scheduled: list[ScheduledRequest]) -> list[PlanItem]:
        items = super().take_items(scheduled)
        if not items or not isinstance(items[-1], CpuRowsItem):
            return items
        rows = items[-1]
        mode, rule = self.options.pipeline, self.options.rule
        on = mode is PipelineMode.ON or (mode is PipelineMode.AUTO and rule is not None
                                         and rule.pipelined(scheduled, len(rows.request_ids),
                                                            rows.num_context_tokens))
        if on:
            items[-1] = CpuRowsItem(rows.request_ids, rows.num_context_tokens, pipelined=True)
            self.num_pipelined_steps += 1
        return items


@register_system
class NeoSystem(HostResidentSystem):
    name = "neo"
    policy = NeoPolicy
    args = NeoArgs

    def options(self, args: SystemArgs, config: EngineConfig) -> NeoOptions:
        assert isinstance(args, NeoArgs)
        try:
            mode = PipelineMode(args.pipeline)
        except ValueError:
            raise ConfigError(f"--neo-pipeline: auto, on or off, not {args.pipeline!r}") from None
        return NeoOptions(swap_in_fraction=args.swap_in_fraction,
                          max_model_len=config.scheduler.max_model_len,
                          cpu_threads=args.cpu_threads, pipeline=mode,
                          cpu_balance=args.cpu_balance,
                          max_step_tokens=config.scheduler.max_num_batched_tokens)

    def after_pools(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        """NEO's rules (pipelining, balance) priced by the simulator's cost model, or the
        real engine's own (its calibration, else the hardware profile's ceilings)."""
        opts = config.policy_options
        assert isinstance(opts, NeoOptions)
        auto = opts.pipeline is PipelineMode.AUTO
        if not auto and opts.cpu_balance == 0:
            return config
        cm = ctx.cost_model if ctx.cost_model is not None else _cost_model(config, ctx)
        rule = PipelineRule(cm, price_cpu_rows) if auto else None
        balance = CpuBalance(cm, price_cpu_rows, opts.cpu_balance, opts.max_step_tokens) \
            if opts.cpu_balance > 0 else None
        return config.with_(policy_options=replace(opts, rule=rule, balance=balance))

    def check(self, config: EngineConfig) -> None:
        if config.dtype in ("float16", "fp16", "half"):
            raise ConfigError("--kv-policy neo: the CPU attention reads bf16 or fp32 KV, "
                              f"not {config.dtype}")

    def make_source(self, runner: Any):
        from kvtier.policies.neo.runner_side import NeoSource

        assert isinstance(runner.config.policy_options, NeoOptions)
        return NeoSource(runner, CpuRowsItem, runner.config.policy_options.cpu_threads)


def _cost_model(config: EngineConfig, ctx: AssemblyContext):
    from kvtier.costmodel.calibration import Calibration
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel
    from kvtier.policies.registry import system_cost_config

    args = ctx.system_args
    assert isinstance(args, NeoArgs)
    calib = Calibration.load(args.calibration) if args.calibration else None
    return CostModel(config.model_config, ctx.hw or get_hardware("h200"), calib,
                     system_cost_config(config, ctx.block_bytes))


register_item(CpuRowsItem, run=run_rows, price=price_cpu_rows)

__all__ = ["CpuRowsItem", "NeoArgs", "NeoOptions", "NeoPolicy", "NeoSystem"]
