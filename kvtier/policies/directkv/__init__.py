"""DirectKV (`--kv-policy directkv`): host-running requests (kvtier/policies/host_resident/)
attend on the GPU over their KV where it lies, in pinned host memory, read through its UVA
address (runner_side.py, host_attention.py); priced by the bytes the reads move over PCIe
at the zero-copy kernel's rate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.core.items import register_item
from kvtier.costmodel.hardware import CopyMechanism
from kvtier.policies.host_resident import (
    HostResidentArgs,
    HostResidentPolicy,
    HostResidentSystem,
    HostRows,
    kv_bytes_per_token,
    run_rows,
)
from kvtier.policies.registry import register_system


@dataclass(frozen=True, slots=True)
class ZeroCopyRowsItem(HostRows):
    kind = "directkv_rows"


def price_zero_copy_rows(cost_model, num_context_tokens: int) -> float:
    """Every context token's K and V of every layer crosses PCIe once a step, one kernel a
    layer."""
    gather = cost_model.hw.h2d[CopyMechanism.KERNEL_GATHER]
    return gather.seconds(num_context_tokens * kv_bytes_per_token(cost_model),
                          cost_model.mc.num_layers)


@dataclass(frozen=True)
class DirectKVArgs(HostResidentArgs):
    prefix = "directkv"


class DirectKVPolicy(HostResidentPolicy):
    rows_item = ZeroCopyRowsItem


@register_system
class DirectKVSystem(HostResidentSystem):
    name = "directkv"
    policy = DirectKVPolicy
    args = DirectKVArgs

    def make_source(self, runner: Any):
        from kvtier.policies.directkv.runner_side import DirectKVSource

        return DirectKVSource(runner, ZeroCopyRowsItem)


register_item(ZeroCopyRowsItem, run=run_rows, price=price_zero_copy_rows)

__all__ = ["DirectKVArgs", "DirectKVPolicy", "DirectKVSystem", "ZeroCopyRowsItem"]
