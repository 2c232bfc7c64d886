"""The seam between shared code and memory systems. Shared code (scheduler, assembly,
runner, cost model) calls a memory system only through the hooks below; everything else of
a system lives in its package, `kvtier/policies/<name>/` (see docs/ADDING_A_MEMORY_SYSTEM.md).

Two objects per system:

`KVPolicy` — its scheduling decisions, one instance per engine, called by the scheduler
inside `schedule()` (pure Python, no tensors: the simulator runs it unchanged).
  * `before_step(running, kv, waiting)`: first thing every step. May change placements of
    running requests through the KV manager (drop a prefix, offload blocks). Returns None.
  * `make_room(running, kv, num_blocks)`: the scheduler is `num_blocks` device blocks short
    for a running request. May free blocks of running requests without preempting them;
    True only if at least `num_blocks` were freed (else it changed nothing, and the
    scheduler preempts).
  * `num_held_back(running) -> int`: right after before_step: how many of `running`'s
    leading requests sit this step out (they keep their KV and their place, and are not
    scheduled); 0 by default.
  * `preempt(req, kv) -> Preemption`: take the request's KV off the device. Must set
    req.status to WAITING (KV dropped: it re-prefills; `kind` RECOMPUTE) or SWAPPED (its KV
    or a stand-in stays somewhere; it comes back through resume). Its copies and plan
    items go into this step's plan, before anything of the step runs.
  * `can_resume(req, kv, n, use_watermark) -> bool` / `resume(req, kv) -> Resume`: a SWAPPED
    request comes back with room for `n` more tokens, above the KV manager's watermark when
    `use_watermark` (False while nothing runs: the watermark protects running requests, and
    would keep out for good one that needs the whole pool); `can_resume` changes nothing,
    `resume` (called only after True) re-places its KV on the device and says what the
    runner must do for it.
  * `take_items(scheduled) -> list[PlanItem]`: last, once per schedule(), with the step's
    scheduled requests (decodes first): the plan items of the policy's own work this step
    that no Preemption/Resume carried (the copies of placement changes made in
    before_step, per-step work for rows it placed). They go first in the plan's items.

`MemorySystem` — everything else of the system, registered by name (`register_system`):
  * `policy`: its KVPolicy class; `args`: its CLI flags (a `SystemArgs` frozen dataclass,
    kvtier/policies/options.py); `options(args, config)`: its typed, frozen options (a
    `SystemOptions`), which become `EngineConfig.policy_options`.
  * assembly hooks (kvtier/engine/assembly.py calls them, in this order, for the real
    engine and the simulator alike; each returns a new config or a value and mutates
    nothing it is given): `check(config)`, `priced(config, ctx)` (once the pricing model is
    known), `reserved_device_blocks(config)` (device blocks taken from the KV pool's memory
    for its own use), `host_pools(config, ctx, num_host_blocks)`, `kv_manager_options(...)`,
    `prepare_executor(executor, ctx, pools)` (before the executor allocates its pools; the
    one hook that may mutate: the executor it is given), `after_pools(config, ctx)`.
  * its plan items, their runner hooks and prices: `kvtier.core.items.register_item`.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from kvtier.config import EngineConfig, SystemOptions
from kvtier.core.items import PlanItem
from kvtier.core.plan import BlockCopy, ScheduledRequest
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.options import NoArgs, SystemArgs

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext


class PreemptionKind(enum.Enum):
    RECOMPUTE = "recompute"  # KV dropped; the request re-prefills prompt + output later
    SWAP = "swap"  # KV moved to the host pool; copied back before it runs again
    HIDDEN = "hidden"  # KV dropped, a stand-in kept; KV rebuilt before it runs


@dataclass(frozen=True)
class Preemption:
    kind: PreemptionKind
    copies: list[BlockCopy] = field(default_factory=list)  # device -> host (the runner's)
    num_dropped_tokens: int = 0  # tokens whose KV must be computed again
    items: list[PlanItem] = field(default_factory=list)  # the system's own work

    @property
    def resumable(self) -> bool:
        """The request waits in the swapped queue (True) or re-prefills (False)."""
        return self.kind is not PreemptionKind.RECOMPUTE


@dataclass(frozen=True)
class Resume:
    copies: list[BlockCopy] = field(default_factory=list)  # host -> device (the runner's)
    restore_tokens: int = 0  # tokens whose KV the runner rebuilds from a stand-in
    restore_from: int = 0  # the first of them (the ones before it came back as they were)
    items: list[PlanItem] = field(default_factory=list)  # the system's own work


class KVPolicy(ABC):
    name: ClassVar[str]

    def __init__(self, options: SystemOptions):
        self.options = options

    @abstractmethod
    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        """Take `req`'s KV off the device. Sets req.status to WAITING or SWAPPED."""

    def before_step(self, running: list[Request], kv: KVCacheManager,
                    waiting: Iterable[Request] = ()) -> None:
        """Called at the start of every schedule(): proactive placement changes."""
        return None  # most policies act only when memory runs out

    def num_held_back(self, running: list[Request]) -> int:
        """Leading running requests not scheduled this step (they wait for a later one)."""
        return 0

    def make_room(self, running: list[Request], kv: KVCacheManager, num_blocks: int) -> bool:
        """Free at least `num_blocks` device blocks without preempting anyone, if the policy
        can (True), before the scheduler falls back to preemption (False)."""
        return False

    def take_items(self, scheduled: list[ScheduledRequest]) -> list[PlanItem]:
        """This step's plan items made outside preempt/resume (none by default)."""
        return []

    def can_resume(self, req: Request, kv: KVCacheManager, num_new_tokens: int,
                   use_watermark: bool = True) -> bool:
        return kv.can_swap_in(req, num_new_tokens, use_watermark)

    def resume(self, req: Request, kv: KVCacheManager) -> Resume:
        """Bring a SWAPPED request's KV back; the caller checked can_resume."""
        return Resume(copies=kv.swap_in(req))


def drop_kv(req: Request, kv: KVCacheManager) -> Preemption:
    """vLLM V1's preemption: free every block, re-prefill prompt + generated tokens later."""
    dropped = req.num_computed_tokens
    kv.free(req)
    req.num_computed_tokens = 0
    req.status = RequestStatus.WAITING
    return Preemption(PreemptionKind.RECOMPUTE, num_dropped_tokens=dropped)


@dataclass(frozen=True)
class HostPools:
    """What a system makes of the host memory: KV blocks and, for a system that keeps
    something else there, a count of its own blocks (None: none)."""

    num_host_blocks: int
    num_state_blocks: int | None = None


class MemorySystem:
    """Defaults: a system with no options, no pools of its own, nothing to assemble."""

    name: ClassVar[str] = ""
    policy: ClassVar[type[KVPolicy]]
    args: ClassVar[type[SystemArgs]] = NoArgs
    # Its place in `make run`'s comparison (kvtier demo), lowest first; None: not shown.
    demo_order: ClassVar[int | None] = None

    def options(self, args: SystemArgs, config: EngineConfig) -> SystemOptions:
        return SystemOptions()

    def make_policy(self, options: SystemOptions) -> KVPolicy:
        return self.policy(options)

    def check(self, config: EngineConfig) -> None:
        """Raise ConfigError for a config the system cannot serve (no device needed)."""
        return None

    def check_unused_flags(self, args: SystemArgs) -> None:
        """Another system serves: raise ConfigError for flags of this one that would
        silently do nothing."""
        return None

    def priced(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        return config

    def reserved_device_blocks(self, config: EngineConfig) -> int:
        return 0

    def host_pools(self, config: EngineConfig, ctx: AssemblyContext,
                   num_host_blocks: int) -> HostPools:
        return HostPools(num_host_blocks)

    def kv_manager_options(self, config: EngineConfig, pools: HostPools) -> dict[str, Any]:
        """Keyword arguments of KVCacheManager beyond the pools' sizes."""
        return {}

    def prepare_executor(self, executor: Any, ctx: AssemblyContext, pools: HostPools) -> None:
        return None

    def after_pools(self, config: EngineConfig, ctx: AssemblyContext) -> EngineConfig:
        return config

    def cost_model_options(self, config: EngineConfig) -> dict[str, Any]:
        """CostModelConfig fields that price how the runner executes this system's steps."""
        return {}
