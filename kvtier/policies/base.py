"""The policy interface: what to do with a request's KV when the device pool runs out, and
how to bring it back. Policies decide placements; the KV manager carries them out."""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import ClassVar

from kvtier.config import PolicyOptions
from kvtier.core.plan import BlockCopy
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager


class PreemptionKind(enum.Enum):
    RECOMPUTE = "recompute"  # KV dropped; the request re-prefills prompt + output later
    SWAP = "swap"  # KV moved to the host pool; copied back before it runs again
    HIDDEN = "hidden"  # KV dropped, hidden states kept; KV re-projected before it runs


@dataclass(frozen=True)
class Preemption:
    kind: PreemptionKind
    copies: list[BlockCopy] = field(default_factory=list)  # device -> host
    num_dropped_tokens: int = 0  # tokens whose KV must be computed again


class KVPolicy(ABC):
    name: ClassVar[str]
    keeps_hidden_states: ClassVar[bool] = False  # needs a HiddenStore (HCache)

    def __init__(self, options: PolicyOptions):
        self.options = options

    @abstractmethod
    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        """Take `req`'s KV off the device. Sets req.status to WAITING or SWAPPED."""

    def before_step(self, running: list[Request], kv: KVCacheManager,
                    waiting: Iterable[Request] = ()) -> None:
        """Called at the start of every schedule(): proactive placement changes."""
        return None  # most policies act only when memory runs out

    def make_room(self, running: list[Request], kv: KVCacheManager, num_blocks: int) -> bool:
        """Free at least `num_blocks` device blocks without preempting anyone, if the policy
        can (True), before the scheduler falls back to preemption (False)."""
        return False

    def can_resume(self, req: Request, kv: KVCacheManager, num_new_tokens: int) -> bool:
        return kv.can_swap_in(req, num_new_tokens)

    def resume(self, req: Request, kv: KVCacheManager) -> Resume:
        """Bring a SWAPPED request's KV back; the caller checked can_resume."""
        return Resume(copies=kv.swap_in(req))


@dataclass(frozen=True)
class Resume:
    copies: list[BlockCopy] = field(default_factory=list)  # host -> device
    restore_tokens: int = 0  # tokens whose KV the runner re-projects from hidden states


def drop_kv(req: Request, kv: KVCacheManager) -> Preemption:
    """vLLM V1's preemption: free every block, re-prefill prompt + generated tokens later."""
    dropped = req.num_computed_tokens
    kv.free(req)
    req.num_computed_tokens = 0
    req.status = RequestStatus.WAITING
    return Preemption(PreemptionKind.RECOMPUTE, num_dropped_tokens=dropped)


_REGISTRY: dict[str, Callable[..., KVPolicy]] = {}


def register_policy(name: str) -> Callable[[type[KVPolicy]], type[KVPolicy]]:
    def deco(cls: type[KVPolicy]) -> type[KVPolicy]:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return deco


def get_policy(name: str, options: PolicyOptions | None = None) -> KVPolicy:
    if name not in _REGISTRY:
        raise ValueError(f"unknown kv policy {name!r}; available: {', '.join(policy_names())}")
    return _REGISTRY[name](options or PolicyOptions())


def policy_names() -> list[str]:
    return sorted(_REGISTRY)
