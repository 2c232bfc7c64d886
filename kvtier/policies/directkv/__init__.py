"""DirectKV (`--kv-policy directkv`): host-running requests (kvtier/policies/host_resident/)
attend on the GPU over their KV where it lies, in pinned host memory, read through its UVA
address (runner_side.py, host_attention.py); priced by the bytes the reads move over PCIe
at the zero-copy kernel's rate, plus the profile's per-layer cost of a step with host rows.
A decode moves to the host only where that pays against recomputing it
(`--directkv-balance`, kvtier/policies/host_resident/balance.py's cheaper_than_recompute)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from kvtier.config import ConfigError, EngineConfig, SystemOptions
from kvtier.core.items import register_item
from kvtier.costmodel.hardware import HostAttention
from kvtier.policies.host_resident import (
    HostResidentArgs,
    HostResidentOptions,
    HostResidentPolicy,
    HostResidentSystem,
    HostRows,
    SplitRows,
    kv_bytes_per_token,
    run_rows,
)
from kvtier.policies.host_resident.balance import HostBalance, cheaper_than_recompute
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import register_system

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext


@dataclass(frozen=True, slots=True)
class ZeroCopyRowsItem(HostRows):
    kind = "directkv_rows"


@dataclass(frozen=True, slots=True)
class ZeroCopySplitRowsItem(SplitRows):
    kind = "directkv_split_rows"


def price_zero_copy_rows(cost_model, num_context_tokens: int) -> float:
    """Every host token's K and V of every layer crosses PCIe once a step; the profile
    prices the per-layer cost of the host reads beside the bytes. (A row's device suffix is
    attended from HBM: the step's decode attention prices it.)"""
    cost = cost_model.hw.host_attention_cost(HostAttention.ZERO_COPY)
    return cost.seconds(num_context_tokens * kv_bytes_per_token(cost_model),
                        cost_model.mc.num_layers)


def price_split_rows(cost_model, num_rows: int) -> float:
    """Rows with a device suffix: the profile's extra cost per layer of such a step (the
    suffix's read and the merge), once a step however many rows split."""
    cost = cost_model.hw.host_attention_cost(HostAttention.ZERO_COPY)
    return cost_model.mc.num_layers * cost.split_layer_s if num_rows else 0.0


@dataclass(frozen=True)
class DirectKVArgs(HostResidentArgs):
    prefix = "directkv"
    balance: float = field(
        default=1.0, metadata={"help": "directkv: a decode moves to the host only while what "
                                       "its host reads add to the steps it still runs stays "
                                       "<= this times recomputing it (else the scheduler "
                                       "preempts); 0: no limit"})
    side_stream: bool = field(
        default=True, metadata={"help": "directkv: on a GPU the host rows run on a side "
                                        "stream beside the device rows' attention (off: in "
                                        "line before it)"})
    graphs: bool = field(
        default=True, metadata={"help": "directkv: decode-only steps with host rows replay a "
                                        "full-model CUDA graph, their host rows in line (off: "
                                        "the piecewise forward, as steps with prefills)"})
    partial_moves: bool = field(
        default=False, metadata={"help": "directkv: a move takes only the oldest blocks the "
                                         "device is short of, not the whole request; its row "
                                         "attends over the host prefix and the device suffix "
                                         "and merges the two by log-sum-exp"})


@dataclass(frozen=True)
class DirectKVOptions(HostResidentOptions):
    balance: float = 1.0  # host_resident/balance.py's factor; 0: no limit
    side_stream: bool = True  # runner_side.py's SideStream on a GPU
    graphs: bool = True  # graph_rows.py: host rows inside the full-model decode graphs

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.balance >= 0:
            raise ConfigError(f"--directkv-balance must be >= 0, got {self.balance}")


class DirectKVPolicy(HostResidentPolicy):
    rows_item = ZeroCopyRowsItem
    split_item = ZeroCopySplitRowsItem
    options: DirectKVOptions

    def __init__(self, options: SystemOptions):
        super().__init__(options if isinstance(options, DirectKVOptions) else DirectKVOptions())


@register_system
class DirectKVSystem(HostResidentSystem):
    name = "directkv"
    policy = DirectKVPolicy
    args = DirectKVArgs

    def options(self, args: SystemArgs, config: EngineConfig) -> DirectKVOptions:
        assert isinstance(args, DirectKVArgs)
        return DirectKVOptions(**self.shared_options(args, config), balance=args.balance,
                               side_stream=args.side_stream, graphs=args.graphs,
                               partial_moves=args.partial_moves)

    def after_pools(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        """The balance priced by the simulator's cost model or the real engine's own."""
        opts = config.policy_options
        assert isinstance(opts, DirectKVOptions)
        if opts.balance == 0:
            return config
        rule = HostBalance(self.pricing(config, ctx), price_zero_copy_rows, opts.balance,
                           opts.step_limits, opts.max_model_len,
                           pays=cheaper_than_recompute,
                           price_split=price_split_rows if opts.partial_moves else None)
        return config.with_(policy_options=replace(opts, balance_rule=rule))

    def make_source(self, runner: Any):
        from kvtier.policies.directkv.runner_side import DirectKVSource

        opts = runner.config.policy_options
        assert isinstance(opts, DirectKVOptions)
        return DirectKVSource(runner, ZeroCopyRowsItem, opts.side_stream, opts.graphs,
                              opts.partial_moves)


register_item(ZeroCopyRowsItem, run=run_rows, price=price_zero_copy_rows)
register_item(ZeroCopySplitRowsItem, run=run_rows, price=price_split_rows)

__all__ = ["DirectKVArgs", "DirectKVOptions", "DirectKVPolicy", "DirectKVSystem",
           "ZeroCopyRowsItem", "ZeroCopySplitRowsItem", "price_split_rows",
           "price_zero_copy_rows"]
