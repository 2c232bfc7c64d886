"""Sizing the KV pools: what is left of the configured memory after weights and activations."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from kvtier.config import ConfigError, EngineConfig
from kvtier.kv.manager import cdiv

GiB = 1 << 30
# The CPU path has no "GPU memory" to take a fraction of: its pool holds every seat at
# max_model_len where that is small, else CPU_DEFAULT_KV_GB, but never less than one request
# of max_model_len as far as CPU_MAX_KV_GB goes (a first run stays small, a real model starts).
CPU_DEFAULT_KV_GB = 0.25
CPU_MAX_KV_GB = 2.0


@dataclass(frozen=True)
class PoolSizes:
    num_gpu_blocks: int
    num_host_blocks: int
    block_bytes: int


def dtype_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def check_weights_fit(config: EngineConfig, device: torch.device, dtype: torch.dtype) -> None:
    """Fail before allocating anything if the weights alone exceed the configured memory."""
    weight_bytes = config.model_config.num_params() * dtype_bytes(dtype)
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
        budget = total * config.cache.gpu_memory_utilization
        where = f"{config.cache.gpu_memory_utilization:.2f} x {total / GiB:.1f} GiB of GPU memory"
    else:
        budget = _host_available_bytes()
        where = f"{budget / GiB:.1f} GiB of available host memory"
    if weight_bytes > budget:
        raise ConfigError(
            f"model {config.model!r} needs {weight_bytes / GiB:.1f} GiB of weights "
            f"({dtype}), more than {where}"
        )


def _host_available_bytes() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def size_pools(
    config: EngineConfig, device: torch.device, dtype: torch.dtype, activation_peak: int,
    reserved_blocks: int = 0,
) -> PoolSizes:
    """`reserved_blocks`: device blocks taken from the same memory for other uses (a memory
    system's, e.g. the recompute scratch); an explicit block count is the KV pool alone."""
    cache, mc = config.cache, config.model_config
    block_bytes = cache.block_bytes(mc, dtype_bytes(dtype))
    explicit = explicit_gpu_blocks(config, block_bytes)
    if explicit is not None:
        num_gpu = explicit
    elif device.type == "cuda":
        # vLLM's rule: the pool gets util x total, minus everything in use now (weights, CUDA
        # context, library workspaces: total - free) and the profiled activation peak.
        free, total = torch.cuda.mem_get_info(device)
        budget = total * cache.gpu_memory_utilization - (total - free) - activation_peak
        num_gpu = int(budget // block_bytes)
        if num_gpu <= 0:
            raise ConfigError(
                f"no GPU memory left for the KV pool: {cache.gpu_memory_utilization:.2f} x "
                f"{total / GiB:.1f} GiB, {(total - free) / GiB:.1f} GiB in use, activation peak "
                f"{activation_peak / GiB:.2f} GiB; raise --gpu-memory-utilization or set "
                "--kv-cache-gb"
            )
    else:
        return _cpu_pools(config, block_bytes, reserved_blocks)
    return complete_pools(config, num_gpu, block_bytes, reserved_blocks)


def _cpu_pools(config: EngineConfig, block_bytes: int, reserved_blocks: int) -> PoolSizes:
    """Device and host pools on the CPU, sized from the model and the scheduler's limits:
    max_num_seqs requests of max_model_len never need more (nor a swap space beyond it)."""
    cache = config.cache
    per_request = cache.num_layer_groups(config.model_config.num_layers) * cdiv(
        config.scheduler.max_model_len, cache.block_size)
    seats = config.scheduler.max_num_seqs * per_request
    one_request = min(per_request, int(CPU_MAX_KV_GB * GiB // block_bytes))
    budget = max(int(CPU_DEFAULT_KV_GB * GiB // block_bytes), one_request)
    pools = complete_pools(config, min(seats, budget) + reserved_blocks, block_bytes,
                           reserved_blocks)
    if cache.num_host_blocks is not None:
        return pools
    return PoolSizes(pools.num_gpu_blocks, min(pools.num_host_blocks, seats), block_bytes)


def complete_pools(config: EngineConfig, num_gpu: int, block_bytes: int,
                   reserved_blocks: int = 0) -> PoolSizes:
    """From the device blocks memory allows: take out `reserved_blocks` (unless the count
    was given explicitly), size the host pool, and refuse a pool smaller than one request
    of max_model_len. Shared by the real engine and the simulator."""
    cache, mc = config.cache, config.model_config
    if cache.num_gpu_blocks is None:
        num_gpu -= reserved_blocks
    if cache.num_host_blocks is not None:
        num_host = cache.num_host_blocks
    else:
        num_host = int(cache.swap_space_gb * GiB // block_bytes)
    groups = cache.num_layer_groups(mc.num_layers)
    need = groups * cdiv(config.scheduler.max_model_len, cache.block_size)
    if num_gpu < need:
        tokens = max(num_gpu, 0) // groups * cache.block_size
        raise ConfigError(
            f"the KV pool holds {max(num_gpu, 0)} blocks ({tokens} tokens), fewer than one "
            f"request of max_model_len={config.scheduler.max_model_len} needs ({need} blocks); "
            "give more memory (--gpu-memory-utilization / --kv-cache-gb) or lower --max-model-len"
        )
    return PoolSizes(num_gpu, num_host, block_bytes)


def explicit_gpu_blocks(config: EngineConfig, block_bytes: int) -> int | None:
    """The device pool's block count when the config gives it (a count or a size in GiB),
    else None: the rule size_pools applies first, shared with the simulated device."""
    cache = config.cache
    if cache.num_gpu_blocks is not None:
        return cache.num_gpu_blocks
    if cache.kv_cache_gb is not None:
        return int(cache.kv_cache_gb * GiB // block_bytes)
    return None
