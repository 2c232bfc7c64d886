"""Plan items of the host-resident placement: a running request's KV moving to the host
pool (MoveToHost) and back (MoveToDevice), and, each step, the decode rows that attend over host
KV (HostRows; each system subclasses it with its own kind, priced its own way). Torch-free:
the runner hooks reach the tensors through the source the system attached to the runner."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.core.items import PlanItem
from kvtier.core.plan import BlockCopy
from kvtier.costmodel.hardware import CopyMechanism

Table = tuple[tuple[int, ...], ...]  # block ids per layer group


@dataclass(frozen=True, slots=True)
class _Move(PlanItem):
    """A running request's blocks changing pool; `table` is its whole block table
    afterwards, for the runner's row."""

    request_id: str
    copies: tuple[BlockCopy, ...]
    table: Table

    @property
    def count(self) -> int:
        return len(self.copies)


@dataclass(frozen=True, slots=True)
class MoveToHost(_Move):
    """Device blocks -> host pages of a running request (the table holds host ids)."""

    kind = "host_resident_store"


@dataclass(frozen=True, slots=True)
class MoveToDevice(_Move):
    """Host pages -> device blocks of a host-running request coming back."""

    kind = "host_resident_load"


@dataclass(frozen=True, slots=True)
class HostRows(PlanItem):
    """This step's leading decode rows whose KV lives in the host pool, whole or a leading
    part of it (`host_tokens`, per row; () when every row's whole context is there). Priced by
    the host tokens their attention reads (each subclass at its mechanism's rate)."""

    kind = ""
    request_ids: tuple[str, ...]
    num_context_tokens: int  # host tokens, summed over the rows
    host_tokens: tuple[int, ...] = ()

    @property
    def count(self) -> int:
        return self.num_context_tokens


@dataclass(frozen=True, slots=True)
class SplitRows(PlanItem):
    """How many of this step's host rows keep a device suffix (partial moves): the system
    attends and merges both parts, which costs the step more than whole host rows do. Each
    system that splits rows subclasses it with its own kind and price."""

    kind = ""
    num_rows: int

    @property
    def count(self) -> int:
        return self.num_rows


def price_store(cost_model, num_blocks: int) -> float:
    """The moves copy with the UVA page kernel (HostPageIO), not the swap path: priced at
    the profile's kernel-gather rate, one launch a step."""
    gather = cost_model.hw.d2h[CopyMechanism.KERNEL_GATHER]
    return gather.seconds(num_blocks * cost_model.config.block_bytes)


def price_load(cost_model, num_blocks: int) -> float:
    gather = cost_model.hw.h2d[CopyMechanism.KERNEL_GATHER]
    return gather.seconds(num_blocks * cost_model.config.block_bytes)


def kv_bytes_per_token(cost_model) -> int:
    """K and V of one token over all layers, at the serving dtype's 2 bytes (the GPU's)."""
    return cost_model.mc.kv_bytes_per_token(2)
