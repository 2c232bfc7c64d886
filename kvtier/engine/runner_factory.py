"""The real engine's executor factory for `assemble`: the model runner on the resolved
device, its pools sized from what the device's memory leaves (kvtier/engine/memory.py)."""

from __future__ import annotations

import time
from typing import Any

from kvtier.config import EngineConfig
from kvtier.engine.memory import PoolSizes, check_weights_fit, dtype_bytes, size_pools
from kvtier.policies.base import HostPools
from kvtier.runner.device import resolve_device, resolve_dtype
from kvtier.tokenizer import Tokenizer


class RunnerFactory:
    simulated = False
    hw = None  # prices that need ceilings use the H200's measured ones
    plan_for = None

    def __init__(self, device: str, dtype: str):
        """`device`, `dtype`: EngineArgs' (auto, cpu, cuda; auto, float32, ...)."""
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.dtype_bytes = dtype_bytes(self.dtype)
        self.clock = time.monotonic
        self._runner: Any = None
        self._peak = 0

    def check(self, config: EngineConfig) -> None:
        check_weights_fit(config, self.device, self.dtype)

    def start(self, config: EngineConfig, ckpt: Any) -> None:
        from kvtier.runner.model_runner import ModelRunner

        self._runner = ModelRunner(config, ckpt, self.device, self.dtype)
        self._peak = self._runner.profile_activation_peak()

    def pricing_model(self, config: EngineConfig, block_bytes: int) -> Any:
        return None

    def size_pools(self, config: EngineConfig, reserved_blocks: int) -> PoolSizes:
        return size_pools(config, self.device, self.dtype, self._peak,
                          reserved_blocks=reserved_blocks)

    def executor(self, config: EngineConfig, tokenizer: Tokenizer) -> Any:
        # The runner was built with the config before the memory system priced it; what
        # changed since (its options) is handed over here.
        self._runner.config = config
        return self._runner

    def allocate(self, executor: Any, num_gpu_blocks: int, num_host_blocks: int,
                 reserved_blocks: int) -> None:
        executor.allocate_kv(num_gpu_blocks, num_host_blocks, reserved_blocks)
        if self.device.type == "cuda":
            executor.warm_up_steps()

    def decode_graphs(self, executor: Any) -> bool:
        return bool(executor.use_cuda_graphs)

    def describe(self, config: EngineConfig, pools: PoolSizes, host: HostPools) -> str:
        return (f"kvtier: {config.model} on {self.device} ({self.dtype}), "
                f"{pools.num_gpu_blocks} device + {host.num_host_blocks} host KV blocks of "
                f"{pools.block_bytes // 1024} KiB, policy {config.kv_policy}")
