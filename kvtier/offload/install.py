"""Put the host tier on an engine whose KV manager has a prefix cache: the index under the
device tier, the runner's pinned pages and copies (a model runner; a simulated executor
prices the items instead, and times the copies at those prices), and cache-aware admission
on the scheduler."""

from __future__ import annotations

from typing import Any

from kvtier.config import ConfigError
from kvtier.kv.host_tier import HostTier
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCache
from kvtier.offload.args import HostTierArgs, HostTierOptions
from kvtier.offload.copy_times import PricedCopyTimer
from kvtier.offload.scheduling import CacheAwareAdmission
from kvtier.offload.transfers import HostTierCopies, allocate_pages


def _extendable(kv: KVCacheManager) -> PrefixCache:
    """The prefix cache a host tier can go under; ConfigError without one, or when it has
    a host tier already."""
    pc = kv.prefix_cache
    if pc is None:
        raise ConfigError("the host tier extends the prefix cache: turn prefix caching on")
    if pc.lower is not None:
        raise ConfigError("the prefix cache has a host tier already")
    return pc


def attach_index(kv: KVCacheManager, options: HostTierOptions) -> HostTier:
    tier = HostTier(options.tier, kv.num_groups, kv.block_size)
    _extendable(kv).lower = tier
    return tier


def attach_runner(runner: Any, options: HostTierOptions) -> HostTierCopies:
    """The pinned pages (pinned beside a GPU) and the copies' hook on its copy stream."""
    pages = allocate_pages(options.tier.num_pages, runner.block_shape(), runner.dtype,
                           options.io, pin=runner.device.type == "cuda",
                           option=options.size_option)
    copies = HostTierCopies(pages, options.io, runner.num_groups, runner.device)
    runner.copies.tier = copies
    return copies


def enable_host_tier(engine: Any, args: HostTierArgs) -> HostTier:
    """The host tier on `engine` (an LLMEngine, before its first step): returns its index.
    Raises ConfigError for bad flags, HostTierMemoryError when the pages cannot be
    allocated (naming the option to lower)."""
    kv = engine.kv_manager
    options = args.resolve(kv.gpu.num_blocks, engine.block_bytes)
    _extendable(kv)  # before the runner's pages: a refused call changes nothing
    executor = engine.executor
    if hasattr(executor, "copies"):  # the model runner (the simulator has no pools)
        attach_runner(executor, options)
    elif hasattr(executor, "observers"):  # the simulator: copy times at the items' prices
        executor.observers.append(PricedCopyTimer(executor.cost_model))
    tier = attach_index(kv, options)
    engine.scheduler.admission_gate = CacheAwareAdmission(
        kv, tier, options.loading_bound, options.delayed_hits, options.prefetch)
    return tier
