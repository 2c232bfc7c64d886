"""NEO (`--kv-policy neo`): host-running requests (kvtier/policies/host_resident/) attend on
the CPU over their KV in host memory (runner_side.py): only q, k, v and the output cross
PCIe; the KV stays put. Priced by the bytes the CPU attention reads at the host's rate.
A step with CPU decodes runs them sequentially, pipelined, or leaves them out (GPU-only),
by NEO's rule and predicted rates (neo/modes.py, neo/steps.py)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvtier.config import ConfigError, EngineConfig, SystemOptions
from kvtier.core.items import PlanItem, register_item
from kvtier.core.plan import ScheduledRequest
from kvtier.core.request import Request
from kvtier.costmodel.hardware import CPU_ATTENTION_BYTES_PER_S
from kvtier.costmodel.shape import StepShape
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.host_resident import (
    HostResidentArgs,
    HostResidentOptions,
    HostResidentPolicy,
    HostResidentSystem,
    HostRows,
    run_rows,
)
from kvtier.policies.neo.balance import CpuBalance
from kvtier.policies.neo.modes import ModeChoice, forecast
from kvtier.policies.neo.pipeline import PipelineMode, PipelineRule, step_shape
from kvtier.policies.neo.steps import (
    CPU_ROWS_KIND,
    GraphedCpuDecodes,
    PipelinedCpuDecodes,
    SequentialCpuDecodes,
    StepMode,
    StepPrices,
    price_cpu_rows,
    price_graphed_step,
    price_pipelined_step,
    price_sequential_step,
    replays_a_graph,
)
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import register_system

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext


@dataclass(frozen=True, slots=True)
class CpuRowsItem(HostRows):
    kind = CPU_ROWS_KIND
    pipelined: bool = False  # the step runs as two sub-batches (neo/pipeline.py)


@dataclass(frozen=True)
class NeoArgs(HostResidentArgs):
    prefix = "neo"
    cpu_threads: int | None = field(
        default=None, metadata={"help": "neo: threads of the CPU attention (default: torch's "
                                  "less two, left to the main thread)"})
    pipeline: str = field(
        default="auto", metadata={"help": "neo: run steps with CPU decodes as two pipelined "
                                          "sub-batches: auto (NEO's rule, priced by the cost "
                                          "model; GPU-only steps too), on, off"})
    max_skipped_steps: int = field(
        default=4, metadata={"help": "neo (--neo-pipeline auto): a GPU-only step leaves the "
                                     "CPU decodes out when that predicts a better rate, at "
                                     "most this many steps in a row; 0: never"})
    cpu_balance: float = field(
        default=1.0, metadata={"help": "neo: a decode moves to the host only while the CPU "
                                        "attention of all host decodes stays <= this times "
                                        "the step's predicted GPU time (else the scheduler "
                                        "preempts); 0: no limit"})
    graphs: bool = field(
        default=True, metadata={"help": "neo: sequential decode-only steps with CPU decodes "
                                        "replay a full-model CUDA graph that hands each "
                                        "layer's rows to the CPU job through pinned flags "
                                        "(off: the piecewise forward, a layer at a time)"})
    flagged_pipeline: bool = field(
        default=False, metadata={"help": "neo: pipelined steps hand batch 1 to the CPU "
                                          "through the graph steps' flags, the main thread "
                                          "never waiting inside the step (off: it hands "
                                          "each layer over and waits; needs --neo-graphs)"})
    calibration: str | None = field(
        default=None, metadata={"help": "neo: calibration JSON of the cost model that prices "
                                        "the pipelining rule (default: the hardware profile)"})


@dataclass(frozen=True)
class NeoOptions(HostResidentOptions):
    cpu_threads: int | None = None
    pipeline: PipelineMode = PipelineMode.AUTO
    rule: PipelineRule | None = field(default=None, compare=False)  # set once priced
    cpu_balance: float = 1.0  # neo/balance.py's factor; 0: no limit
    max_skipped_steps: int = 4  # a CPU decode sits out at most this many steps in a row
    choice: ModeChoice | None = field(default=None, compare=False)  # set once priced
    graphs: bool = True  # graph_rows.py: sequential decode-only steps as decode graphs
    flagged_pipeline: bool = False  # pipelined.py: batch 1 through the graph steps' flags

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.max_skipped_steps < 0:
            raise ConfigError("--neo-max-skipped-steps must be >= 0, got "
                              f"{self.max_skipped_steps}")
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"neo: cpu_threads must be >= 1, got {self.cpu_threads}")
        if not self.cpu_balance >= 0:
            raise ConfigError(f"--neo-cpu-balance must be >= 0, got {self.cpu_balance}")
        if self.flagged_pipeline and not self.graphs:
            raise ConfigError("--neo-flagged-pipeline hands batch 1 over through the graph "
                              "steps' flags: it needs --neo-graphs")


class NeoPolicy(HostResidentPolicy):
    rows_item = CpuRowsItem
    options: NeoOptions

    def __init__(self, options: SystemOptions):
        super().__init__(options if isinstance(options, NeoOptions) else NeoOptions())
        self.num_pipelined_steps = self.num_gpu_only_steps = 0
        self.num_partly_held_steps = 0  # steps that left some of their CPU decodes out
        self._held = 0  # this step's leading host decodes left out (all: a GPU-only step)
        self._skips: dict[str, int] = {}  # host decode -> steps sat out in a row

    def before_step(self, running: list[Request], kv: KVCacheManager,
                    waiting: Iterable[Request] = ()) -> None:
        super().before_step(running, kv, waiting)
        self._held = self._hold(running, kv, waiting)

    def num_held_back(self, running: list[Request]) -> int:
        return self._held

    def _hold(self, running: list[Request], kv: KVCacheManager,
              waiting: Iterable[Request]) -> int:
        """How many leading host decodes sit this step out: the count of the best predicted
        rate (all of them: a GPU-only step), never one that has sat out max_skipped_steps
        steps in a row, nor any after it."""
        host, opts = kv.host_running, self.options
        if not host or opts.choice is None or opts.pipeline is not PipelineMode.AUTO:
            self._skips = {}
            return 0
        shape, host_ctx = forecast(running, host, waiting, opts.step_limits.start(),
                                   -self._blocks_short(running, kv), kv.block_size,
                                   kv.num_groups, opts.max_step_seqs)
        order = [r.request_id for r in running if r.request_id in host][:len(host_ctx)]
        max_held = next((i for i, r in enumerate(order)
                         if self._skips.get(r, 0) >= opts.max_skipped_steps), len(order))
        held = opts.choice.best_hold(shape, host_ctx, max_held) if max_held else 0
        self._skips = {r: self._skips.get(r, 0) + 1 for r in order[:held]}
        if held == len(order) and held:
            self.num_gpu_only_steps += 1
        elif held:
            self.num_partly_held_steps += 1
        return held

    def take_items(self, scheduled: list[ScheduledRequest]) -> list[PlanItem]:
        items = super().take_items(scheduled)
        if not items or not isinstance(items[-1], CpuRowsItem):
            return items
        rows = items[-1]
        n = len(rows.request_ids)
        shape = step_shape(scheduled)
        if self._mode(shape, n, rows.num_context_tokens) is StepMode.PIPELINED:
            items[-1] = CpuRowsItem(rows.request_ids, rows.num_context_tokens, pipelined=True)
            items.append(PipelinedCpuDecodes(n))
            self.num_pipelined_steps += 1
        elif self.options.graphs and replays_a_graph(shape):
            items.append(GraphedCpuDecodes(n))
        else:
            items.append(SequentialCpuDecodes(n))
        return items

    def _mode(self, shape: StepShape, num_rows: int, host_tokens: int) -> StepMode:
        """Pipelined or sequential, for the step's exact rows (`shape`: step_shape's; auto:
        by NEO's rule and the predicted rates, neo/modes.py)."""
        mode, choice = self.options.pipeline, self.options.choice
        if mode is PipelineMode.ON:
            return StepMode.PIPELINED
        if mode is PipelineMode.OFF or choice is None:
            return StepMode.SEQUENTIAL
        return choice.best(shape, num_rows, host_tokens, gpu_only=False)


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
        return NeoOptions(**self.shared_options(args, config), cpu_threads=args.cpu_threads,
                          pipeline=mode, cpu_balance=args.cpu_balance,
                          max_skipped_steps=args.max_skipped_steps, graphs=args.graphs,
                          flagged_pipeline=args.flagged_pipeline)

    def after_pools(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        """NEO's rules (pipelining, balance) priced by the simulator's cost model, or the
        real engine's own (its calibration, else the hardware profile's ceilings)."""
        opts = config.policy_options
        assert isinstance(opts, NeoOptions)
        auto = opts.pipeline is PipelineMode.AUTO
        if not auto and opts.cpu_balance == 0:
            return config
        assert isinstance(ctx.system_args, NeoArgs)
        cm = self.pricing(config, ctx, ctx.system_args.calibration)
        rule = PipelineRule(cm, price_cpu_rows) if auto else None
        choice = (ModeChoice(StepPrices(cm, graphs=opts.graphs), rule) if rule is not None
                  else None)
        balance = CpuBalance(cm, price_cpu_rows, opts.cpu_balance, opts.step_limits) \
            if opts.cpu_balance > 0 else None
        return config.with_(policy_options=replace(opts, rule=rule, balance_rule=balance,
                                                   choice=choice))

    def check(self, config: EngineConfig) -> None:
        if config.dtype in ("float16", "fp16", "half"):
            raise ConfigError("--kv-policy neo: the CPU attention reads bf16 or fp32 KV, "
                              f"not {config.dtype}")

    def make_source(self, runner: Any):
        from kvtier.policies.neo.runner_side import NeoSource

        opts = runner.config.policy_options
        assert isinstance(opts, NeoOptions)
        return NeoSource(runner, CpuRowsItem, opts.cpu_threads, opts.graphs,
                         opts.flagged_pipeline)


def _marks_only(runner, items) -> None:
    """A mark of how the step runs; the runner reads CpuRowsItem's flag instead."""
    return None


register_item(CpuRowsItem, run=run_rows, price=price_cpu_rows)
register_item(SequentialCpuDecodes, run=_marks_only, price=lambda cm, n: 0.0,
              step=price_sequential_step)
register_item(GraphedCpuDecodes, run=_marks_only, price=lambda cm, n: 0.0,
              step=price_graphed_step)
register_item(PipelinedCpuDecodes, run=_marks_only, price=lambda cm, n: 0.0,
              step=price_pipelined_step)

__all__ = ["CPU_ATTENTION_BYTES_PER_S", "CpuRowsItem", "NeoArgs", "NeoOptions", "NeoPolicy",
           "NeoSystem", "price_cpu_rows"]
