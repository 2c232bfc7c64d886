"""NEO (`--kv-policy neo`): host-running requests (kvtier/policies/host_resident/) attend on
the CPU over their KV in host memory (runner_side.py): only q, k, v and the output cross
PCIe; the KV stays put. Priced by the bytes the CPU attention reads at the host's rate."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvtier.config import ConfigError, EngineConfig
from kvtier.core.items import register_item
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
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import register_system

# KV bytes a second the CPU attention reads on the H200 host's 16 cores (torch's SDPA there;
# shared/research/seed002_implementation_notes.md, NEO section).
CPU_ATTENTION_BYTES_PER_S = 35e9


@dataclass(frozen=True, slots=True)
class CpuRowsItem(HostRows):
    kind = "neo_cpu_rows"


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


@dataclass(frozen=True)
class NeoOptions(HostResidentOptions):
    cpu_threads: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cpu_threads is not None and self.cpu_threads < 1:
            raise ConfigError(f"neo: cpu_threads must be >= 1, got {self.cpu_threads}")


class NeoPolicy(HostResidentPolicy):
    rows_item = CpuRowsItem


@register_system
class NeoSystem(HostResidentSystem):
    name = "neo"
    policy = NeoPolicy
    args = NeoArgs

    def options(self, args: SystemArgs, config: EngineConfig) -> NeoOptions:
        assert isinstance(args, NeoArgs)
        return NeoOptions(swap_in_fraction=args.swap_in_fraction,
                          max_model_len=config.scheduler.max_model_len,
                          cpu_threads=args.cpu_threads)

    def check(self, config: EngineConfig) -> None:
        if config.dtype in ("float16", "fp16", "half"):
            raise ConfigError("--kv-policy neo: the CPU attention reads bf16 or fp32 KV, "
                              f"not {config.dtype}")

    def make_source(self, runner: Any):
        from kvtier.policies.neo.runner_side import NeoSource

        assert isinstance(runner.config.policy_options, NeoOptions)
        return NeoSource(runner, CpuRowsItem, runner.config.policy_options.cpu_threads)


register_item(CpuRowsItem, run=run_rows, price=price_cpu_rows)

__all__ = ["CpuRowsItem", "NeoArgs", "NeoOptions", "NeoPolicy", "NeoSystem"]
