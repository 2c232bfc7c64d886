"""host_keep: a preempted request's KV is kept in the host pool and restored when it comes
back (swap-like, but through plan items of its own). At most `max_kept` requests keep
their KV there at once; the others are recomputed."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.config import SystemOptions
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import KVPolicy, Preemption, PreemptionKind, Resume, drop_kv
from kvtier.policies.options import SystemArgs
from tests.policies.host_keep.items import KeepIn, KeepOut


@dataclass(frozen=True)
class HostKeepArgs(SystemArgs):
    prefix = "host_keep"
    max_kept: int | None = field(
        default=None, metadata={"help": "host_keep: preempted requests that keep their KV in "
                                        "the host pool at once (default: no limit)"})


@dataclass(frozen=True)
class HostKeepOptions(SystemOptions):
    max_kept: int | None = None


class HostKeepPolicy(KVPolicy):
    options: HostKeepOptions

    def __init__(self, options: SystemOptions):
        super().__init__(options if isinstance(options, HostKeepOptions) else HostKeepOptions())
        self.kept: set[str] = set()

    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        cap = self.options.max_kept
        copies = kv.swap_out(req) if cap is None or len(self.kept) < cap else None
        if copies is None:
            return drop_kv(req, kv)
        self.kept.add(req.request_id)
        req.status = RequestStatus.SWAPPED
        return Preemption(PreemptionKind.SWAP, items=[KeepOut(tuple(copies))])

    def resume(self, req: Request, kv: KVCacheManager) -> Resume:
        self.kept.discard(req.request_id)
        return Resume(items=[KeepIn(tuple(kv.swap_in(req)))])
