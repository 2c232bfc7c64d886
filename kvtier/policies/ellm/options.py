"""eLLM's flags (`EllmArgs`, `--ellm-*`) and the typed options they resolve to
(`EllmOptions`, the engine's `policy_options` under `--kv-policy ellm`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtier.config import CacheConfig, ConfigError, ModelConfig, SchedulerConfig, SystemOptions
from kvtier.policies.options import SystemArgs

if TYPE_CHECKING:
    from kvtier.policies.ellm.planner.request_level import RequestLevelPlanner
    from kvtier.policies.ellm.planner.step_budget import StepBudget


@dataclass(frozen=True)
class EllmArgs(SystemArgs):
    prefix = "ellm"
    aliases = (("--ellm-planner-calibration", "ellm_calibration"),)  # its name before it
    # priced the budget too

    uncached_ratio: float | None = field(
        default=None, metadata={"help": "ellm: fixed uncached ratio r for every request"})
    max_uncached_ratio: float = field(
        default=0.5, metadata={"help": "ellm: cap on r when prefixes are dropped on demand"})
    max_recompute_tokens: int | None = field(
        default=None, metadata={"help": "ellm: prefix tokens recomputed per step at most, "
                                        "the recompute scratch (default: 256 for a priced "
                                        "--ellm-recompute-budget, else half the step's "
                                        "token budget)"})
    host_groups: str = field(
        default="0", metadata={"help": "ellm: a dropped prefix keeps its KV of this many top "
                                       "layer groups in the host pool, copied in each step "
                                       "while the lower groups recompute (layer-level "
                                       "overlap); auto: the split whose copy and recompute "
                                       "times match on the H200 roofline; 0: all recompute"})
    copy_window: int = field(
        default=2, metadata={"help": "ellm: of the copied-in layer groups, how many are in "
                                     "flight at once (they share that many sets of scratch; "
                                     "0: all)"})
    recompute_budget: str = field(
        default="auto", metadata={"help": "ellm: prefix tokens a step may recompute when "
                                          "prefixes are dropped on demand: ridge (ridge point "
                                          "minus the step's decodes), cost (priced by the "
                                          "calibrated cost model), auto (cost with "
                                          "--ellm-calibration, else ridge), max, or a count"})
    planner: bool = field(
        default=False, metadata={"help": "ellm: r from the request-level planner (SLSQP)"})
    tpot_slo_ms: float = field(
        default=100.0, metadata={"help": "ellm planner: the TPOT SLO it plans for"})
    calibration: str | None = field(
        default=None, metadata={"help": "ellm: cost-model calibration JSON (kvtier profile) "
                                        "that prices recomputation: the recompute budget and "
                                        "the planner's roofline fit (default: the H200's "
                                        "probe ceilings alone)"})


@dataclass(frozen=True)
class EllmOptions(SystemOptions):
    # A fixed uncached ratio r for every running request (the paper's cache-ratio sweep), or
    # None to drop prefixes only under memory pressure, up to max_uncached_ratio.
    uncached_ratio: float | None = None
    max_uncached_ratio: float = 0.5
    max_recompute_tokens: int = 4096  # dropped-prefix tokens recomputed per step, at most
    # Layer-level overlap: a dropped prefix keeps the KV of this many top layer groups in
    # the host pool; each step copies it in (per group, on the copy stream) while the lower
    # groups recompute theirs, and the prefix rows stop below those groups.
    prefix_host_groups: int = 0
    # ... of which at most this many groups' copies are in flight at once (they share that
    # many sets of scratch: the paper's "swap <= 3 layers at a time"); 0: all of them.
    prefix_copy_window: int = 2
    # Adaptive mode: how many prefix tokens a step may recompute (capped by
    # max_recompute_tokens) — "ridge": what the linear layers carry free, the ridge point
    # minus the step's decodes; "cost": the same priced by the cost model (a step may grow by
    # recompute_tolerance); "auto": "cost" when the engine has a calibrated cost model, else
    # "ridge" when decode steps run eagerly, else 0 (see kvtier.policies.ellm.with_step_budget);
    # "max": max_recompute_tokens; or a token count. planner/step_budget.py.
    recompute_budget: str | int = "auto"
    recompute_tolerance: float = 0.01  # within the cost model's error on decode steps
    # That rule priced for this engine's GPU (built once the cost model is known); None:
    # max_recompute_tokens.
    step_budget: StepBudget | None = None
    # Planned mode: re-chooses r from the running requests every `replan_every` steps
    # (built once pools are sized).
    planner: RequestLevelPlanner | None = None
    replan_every: int = 32

    def __post_init__(self) -> None:
        for name in ("uncached_ratio", "max_uncached_ratio"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v < 1.0:
                raise ConfigError(f"{name} must be in [0, 1), got {v}")
        rule = self.recompute_budget
        if isinstance(rule, bool) or not (rule in ("auto", "ridge", "cost", "max")
                                          or (isinstance(rule, int) and rule >= 0)):
            raise ConfigError("recompute_budget must be auto, ridge, cost, max or a token "
                              f"count >= 0, got {rule!r}")
        if self.recompute_tolerance < 0:
            raise ConfigError("recompute_tolerance must be >= 0")
        if self.prefix_host_groups < 0 or self.prefix_copy_window < 0:
            raise ConfigError("prefix_host_groups and prefix_copy_window must be >= 0")

    @property
    def adaptive(self) -> bool:
        """Prefixes are dropped only on demand (no fixed ratio, no planner)."""
        return self.uncached_ratio is None and self.planner is None


def ellm_options(options: SystemOptions) -> EllmOptions:
    """eLLM's options, or their defaults for a config built without them (its
    policy_options is the base SystemOptions)."""
    return options if isinstance(options, EllmOptions) else EllmOptions()


def copied_groups_in_flight(host_groups: int, copy_window: int) -> int:
    """Offloaded prefixes: copied-in layer groups whose scratch exists at once (they share
    `copy_window` sets; 0: one set each). The recompute scratch (M_o) is 1 + this many sets
    of one group's prefix KV."""
    return min(host_groups, copy_window) if copy_window else host_groups


def resolve_options(args: EllmArgs, mc: ModelConfig, cache: CacheConfig,
                    sched: SchedulerConfig, active: bool) -> EllmOptions:
    """The options the flags ask for; `active`: eLLM is the engine's policy (else the
    roofline's host-group choice is not made)."""
    return EllmOptions(
        uncached_ratio=args.uncached_ratio, max_uncached_ratio=args.max_uncached_ratio,
        max_recompute_tokens=args.max_recompute_tokens or _recompute_cap(args, sched),
        recompute_budget=budget_rule(args.recompute_budget),
        prefix_host_groups=_host_groups(args, mc, cache, active),
        prefix_copy_window=args.copy_window)


def _host_groups(args: EllmArgs, mc: ModelConfig, cache: CacheConfig, active: bool) -> int:
    rule = host_groups_rule(args.host_groups)
    if rule != "auto":
        return int(rule)
    if not active:
        return 0
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.policies.ellm.planner.layer_overlap import choose_host_groups

    return choose_host_groups(mc, get_hardware("h200"), cache.layers_in_block(mc.num_layers),
                              block_size=cache.block_size).host_groups


def _recompute_cap(args: EllmArgs, sched: SchedulerConfig) -> int:
    """The default max_recompute_tokens (it sizes the recompute scratch): half the step's
    token budget for a fixed, planned or explicit budget; 256 for the priced budgets of
    on-demand drops, which stay under the ridge point (below 256 tokens a step on every
    hardware profile in costmodel/hardware.py)."""
    priced = budget_rule(args.recompute_budget) in ("auto", "ridge", "cost")
    if priced and args.uncached_ratio is None and not args.planner:
        return min(256, sched.max_num_batched_tokens // 2)
    return sched.max_num_batched_tokens // 2


def host_groups_rule(rule: str | int) -> str | int:
    """`--ellm-host-groups`: auto, or a group count given as digits."""
    if isinstance(rule, int) or rule == "auto":
        return rule
    if not rule.isdigit():
        raise ConfigError(f"--ellm-host-groups must be auto or a count >= 0, got {rule!r}")
    return int(rule)


def budget_rule(rule: str | int) -> str | int:
    """`--ellm-recompute-budget`: a rule's name, or a token count given as digits."""
    return int(rule) if isinstance(rule, str) and rule.isdigit() else rule
