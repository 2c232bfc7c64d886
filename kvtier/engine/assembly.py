"""One assembly for the real engine and the simulator: config -> checks -> tokenizer ->
executor -> pools -> KV manager, with the memory system's hooks (kvtier/policies/base.py)
at fixed points. Only the executor and what the device's memory is come from the
`ExecutorFactory`: the model runner's (kvtier/engine/runner_factory.py) or the simulated
one's (kvtier/sim/factory.py). Every check that can fail runs before anything large is
allocated.

    config = args.create_engine_config()       system.options (flags -> typed options)
    check_config(config)                       system.check
    factory.check(config); tokenizer
    factory.start(config, ckpt)                the real runner: weights, activation peak
    ctx.cost_model = factory.pricing_model()   the simulator's cost model (real: None)
    config = system.priced(config, ctx)
    pools = factory.size_pools(config, system.reserved_device_blocks(config))
    host = system.host_pools(config, ctx, pools.num_host_blocks)
    executor = factory.executor(config, tokenizer); system.prepare_executor(executor, ...)
    factory.allocate(executor, ...)             the runner's pools, graphs, warm-up
    config = system.after_pools(config, ctx)
    kv = KVCacheManager(..., **system.kv_manager_options(config, host))
"""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, cast

from kvtier.config import ConfigError, EngineConfig
from kvtier.core.executor import Executor
from kvtier.engine.args import EngineArgs
from kvtier.engine.memory import PoolSizes
from kvtier.kv.block_hash import HashAlgo
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.model.generation_config import load_generation_defaults
from kvtier.model.loader import resolve_model_config
from kvtier.policies import get_system
from kvtier.policies.base import HostPools
from kvtier.policies.options import SystemArgs
from kvtier.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("kvtier")


@dataclass
class AssemblyContext:
    """What the memory system's assembly hooks may read; `cost_model` they may also set
    (a system that brings its own pricing model, e.g. from a calibration flag)."""

    args: EngineArgs
    system_args: SystemArgs  # the engine's memory system's flags
    dtype_bytes: int  # of the KV and activations
    simulated: bool
    block_bytes: int  # one KV block
    hw: Any = None  # the simulated GPU's HardwareProfile (None: real; prices use the H200's)
    cost_model: Any = None  # the pricing model (the simulator's own; None for a real engine)
    plan_for: Any = None  # other ceilings a planner should plan with (experiments)
    num_gpu_blocks: int = 0  # after the pools are sized
    decode_graphs: bool = False  # after the executor is allocated: full decode graphs replay


class ExecutorFactory(Protocol):
    simulated: bool
    dtype_bytes: int
    hw: Any
    plan_for: Any

    @property
    def clock(self) -> Callable[[], float]:
        """The engine's clock (read-only here, so a factory may hold a callable subtype)."""
        ...

    def check(self, config: EngineConfig) -> None: ...

    def start(self, config: EngineConfig, ckpt: Any) -> None: ...

    def pricing_model(self, config: EngineConfig, block_bytes: int) -> Any: ...

    def size_pools(self, config: EngineConfig, reserved_blocks: int) -> PoolSizes: ...

    def executor(self, config: EngineConfig, tokenizer: Tokenizer) -> Executor: ...

    def allocate(self, executor: Executor, num_gpu_blocks: int, num_host_blocks: int,
                 reserved_blocks: int) -> None: ...

    def decode_graphs(self, executor: Executor) -> bool: ...

    def describe(self, config: EngineConfig, pools: PoolSizes, host: HostPools) -> str: ...


@dataclass(frozen=True)
class EngineParts:
    """What LLMEngine is made of (`LLMEngine.from_parts`)."""

    config: EngineConfig
    executor: Executor
    tokenizer: Tokenizer
    kv: KVCacheManager
    block_bytes: int
    clock: Callable[[], float]


def assemble(args: EngineArgs, factory: ExecutorFactory) -> EngineParts:
    config = args.create_engine_config()
    check_config(config)
    system = get_system(config.kv_policy)
    factory.check(config)
    config, tokenizer, ckpt = _tokenizer(config)
    mc = config.model_config
    ctx = AssemblyContext(args, args.system_args(config.kv_policy), factory.dtype_bytes,
                          factory.simulated, config.cache.block_bytes(mc, factory.dtype_bytes),
                          hw=factory.hw, plan_for=factory.plan_for)
    factory.start(config, ckpt)
    ctx.cost_model = factory.pricing_model(config, ctx.block_bytes)
    config = system.priced(config, ctx)
    reserved = system.reserved_device_blocks(config)
    pools = factory.size_pools(config, reserved)
    host = system.host_pools(config, ctx, pools.num_host_blocks)
    executor = factory.executor(config, tokenizer)
    system.prepare_executor(executor, ctx, host)
    factory.allocate(executor, pools.num_gpu_blocks, host.num_host_blocks, reserved)
    ctx.num_gpu_blocks, ctx.decode_graphs = pools.num_gpu_blocks, factory.decode_graphs(executor)
    config = system.after_pools(config, ctx)
    kv_options = system.kv_manager_options(config, host)
    config, prefix_cache = prefix_cache_config(config, kv_options)
    kv = KVCacheManager(
        num_groups=config.cache.num_layer_groups(mc.num_layers),
        block_size=config.cache.block_size, num_gpu_blocks=pools.num_gpu_blocks,
        num_host_blocks=host.num_host_blocks, prefix_cache=prefix_cache, **kv_options)
    log.info(factory.describe(config, pools, host))
    return EngineParts(config, executor, tokenizer, kv, pools.block_bytes, factory.clock)


def prefix_cache_config(config: EngineConfig, kv_options: dict[str, Any]
                        ) -> tuple[EngineConfig, PrefixCacheConfig | None]:
    """The prefix cache the KV manager gets, and the config with the choice made: on by
    default (as vLLM's V1) for every memory system whose hidden states, if it keeps any, can
    start after a cache hit (`shares_blocks`); off by default for one that
    cannot, and asked for explicitly with such a system, a ConfigError."""
    cache = config.cache
    store = kv_options.get("hidden_store")
    shares = store is None or getattr(store, "shares_blocks", True)
    enabled = cache.enable_prefix_caching
    if enabled is None:
        enabled = shares
        if not shares:
            log.info("prefix caching is off: kv policy %s cannot share KV blocks",
                     config.kv_policy)
    elif enabled and not shares:
        raise ConfigError(f"--enable-prefix-caching does not work with --kv-policy "
                          f"{config.kv_policy}: its hidden states cannot start after a "
                          "cache hit (use --no-enable-prefix-caching)")
    config = config.with_(cache=replace(cache, enable_prefix_caching=enabled))
    if not enabled:
        return config, None
    return config, PrefixCacheConfig(hash_algo=cast(HashAlgo, cache.prefix_caching_hash_algo))


def check_config(config: EngineConfig) -> None:
    """The checks that need no device (the simulator runs them too)."""
    system = get_system(config.kv_policy)
    if config.load_format not in ("auto", "dummy", "safetensors"):
        raise ConfigError(f"unknown load format {config.load_format!r}")
    mc = config.model_config
    if (config.scheduler.max_model_len > mc.max_position_embeddings
            and os.environ.get("KVTIER_ALLOW_LONG_MAX_MODEL_LEN") != "1"):
        raise ConfigError(f"max_model_len {config.scheduler.max_model_len} exceeds the model's "
                          f"max_position_embeddings {mc.max_position_embeddings} (set "
                          "KVTIER_ALLOW_LONG_MAX_MODEL_LEN=1 to run past it anyway)")
    system.check(config)


def _tokenizer(config: EngineConfig) -> tuple[EngineConfig, Tokenizer, Any]:
    mc = config.model_config
    _, ckpt = resolve_model_config(config.model, config.load_format)
    tokenizer = load_tokenizer(ckpt, config.tokenizer, mc.vocab_size, config.chat_template)
    if not mc.eos_token_ids or ckpt is None:
        # Dummy weights: end-of-sequence is whatever the tokenizer we picked calls it.
        mc = replace(mc, eos_token_ids=tuple(tokenizer.eos_token_ids))
    model_dir = Path(config.model).expanduser()  # dummy weights too: the file is the model's
    defaults = load_generation_defaults(config.generation_config,
                                        model_dir if model_dir.is_dir() else None,
                                        config.override_generation_config)
    eos = tuple(dict.fromkeys(mc.eos_token_ids + defaults.eos_token_ids))
    config = config.with_(model_config=replace(mc, eos_token_ids=eos), generation_defaults=defaults)
    return config, tokenizer, ckpt


def freeze_startup_objects() -> None:
    """Move everything alive after start-up (torch, the model, the engine) out of the
    garbage collector's sight, as vLLM does: a gen-2 collection otherwise walks it all, a
    pause inside a step whose launches the GPU waits on, an idle GPU for that long
    (benchmarks/gpu_path/bench_gc_pauses.py, results/gpu_path/gc_pauses_cpu.json)."""
    gc.collect()
    gc.freeze()
