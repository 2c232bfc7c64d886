"""The host tier's plan items (kvtier/kv/host_tier.py makes them; kvtier/offload/
registers their runner hooks and prices). Torch-free. Every item lists host pages and device
blocks, one per device block (a token block is num_groups of them). The `Direct` subclasses
are the same copies made by the copy engine (io-backend direct): their own kinds,
so the cost model prices each io-backend with its own curve."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, TypeVar

from kvtier.core.items import PlanItem


@dataclass(frozen=True, slots=True)
class _PageCopies(PlanItem):
    """Copies between device blocks and host pages: gpu_blocks[i] <-> host_pages[i]."""

    gpu_blocks: tuple[int, ...]
    host_pages: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.gpu_blocks)


@dataclass(frozen=True, slots=True)
class HostStore(_PageCopies):
    """Copy device blocks into host pages (D2H): page host_pages[i] = gpu_blocks[i]."""

    kind: ClassVar[str] = "host_store"


@dataclass(frozen=True, slots=True)
class HostBackup(_PageCopies):
    """Copy device blocks that stay cached into host pages (D2H), behind the step's loads:
    nothing in the step writes those blocks, so the forward does not wait for it."""

    kind: ClassVar[str] = "host_backup"


@dataclass(frozen=True, slots=True)
class HostPrefetch(_PageCopies):
    """Load host blocks into device blocks of the device tier's own (for a request that
    waits a step), behind the step's loads: no layer of the step waits for it."""

    kind: ClassVar[str] = "host_prefetch"


@dataclass(frozen=True, slots=True)
class HostLoad(PlanItem):
    """Load a request's host hit (H2D) into its new device blocks, before the layers of
    each block's group read it: gpu_blocks[i] = host_pages[i], of layer group groups[i]."""

    kind: ClassVar[str] = "host_load"
    request_id: str
    host_pages: tuple[int, ...]
    gpu_blocks: tuple[int, ...]
    groups: tuple[int, ...]

    @property
    def count(self) -> int:
        return len(self.gpu_blocks)


@dataclass(frozen=True, slots=True)
class HostStoreDirect(HostStore):
    kind: ClassVar[str] = "host_store_direct"


@dataclass(frozen=True, slots=True)
class HostLoadDirect(HostLoad):
    kind: ClassVar[str] = "host_load_direct"


@dataclass(frozen=True, slots=True)
class HostBackupDirect(HostBackup):
    kind: ClassVar[str] = "host_backup_direct"


@dataclass(frozen=True, slots=True)
class HostPrefetchDirect(HostPrefetch):
    kind: ClassVar[str] = "host_prefetch_direct"


# The kernel's item class -> the copy engine's.
_DIRECT: dict[type[PlanItem], type[PlanItem]] = {
    HostStore: HostStoreDirect, HostLoad: HostLoadDirect, HostBackup: HostBackupDirect,
    HostPrefetch: HostPrefetchDirect}

_Item = TypeVar("_Item", bound=PlanItem)


def item_class(cls: type[_Item], direct: bool) -> type[_Item]:
    """The class of a copy item as the io-backend makes it: the copy engine's own kind
    (`direct`), else the kernel's."""
    return _DIRECT[cls] if direct else cls  # type: ignore[return-value]
