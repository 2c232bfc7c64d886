"""KV pool sizes of a simulated GPU: the formula of `kvtier/engine/memory.py` (configured
fraction of device memory, minus weights and the activation peak, in whole blocks) with the
device's memory taken from the hardware profile instead of asked of CUDA.

Under tensor parallelism each GPU holds 1/n of the weights and of every block (KV heads are
split), so the pool holds n times the blocks one GPU's leftover memory would.
"""

from __future__ import annotations

from kvtier.config import ConfigError, EngineConfig
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import GiB, HardwareProfile
from kvtier.engine.builder import recompute_scratch_blocks
from kvtier.engine.memory import PoolSizes, complete_pools
from kvtier.kv.manager import cdiv

BF16 = 2


def activation_peak_bytes(config: EngineConfig, num_gpus: int = 1) -> int:
    """The runner's profile step (max_num_batched_tokens tokens, split into max_model_len
    prompts that each sample) at its peak, inside the MLP: hidden and residual [T, h],
    gate_up [T, 2I], silu(gate) and the product [T, I] each; plus the fp32 logits of the
    sampled rows and their bf16 source."""
    mc, sched = config.model_config, config.scheduler
    t = sched.max_num_batched_tokens
    mlp = t * (2 * mc.hidden_size + 4 * mc.intermediate_size // num_gpus) * BF16
    rows = min(sched.max_num_seqs, cdiv(t, sched.max_model_len))
    logits = rows * mc.vocab_size * (4 + BF16)
    return mlp + logits


def weight_bytes(config: EngineConfig) -> int:
    return config.model_config.num_params() * BF16


def sim_pool_sizes(config: EngineConfig, hw: HardwareProfile, num_gpus: int = 1,
                   calib: Calibration | None = None) -> PoolSizes:
    cache, mc = config.cache, config.model_config
    block_bytes = cache.block_bytes(mc, BF16)
    per_gpu_budget = hw.memory_bytes * cache.gpu_memory_utilization
    weights = weight_bytes(config) / num_gpus
    if weights > per_gpu_budget:
        raise ConfigError(f"model {config.model!r} needs {weights / GiB:.1f} GiB of weights per "
                          f"GPU, more than {cache.gpu_memory_utilization:.2f} x "
                          f"{hw.memory_bytes / GiB:.1f} GiB of the simulated {hw.name}")
    if cache.num_gpu_blocks is not None:
        num_gpu = cache.num_gpu_blocks
    elif cache.kv_cache_gb is not None:
        num_gpu = int(cache.kv_cache_gb * GiB // block_bytes)
    else:
        act = _activation(config, num_gpus, calib, hw)
        num_gpu = int((per_gpu_budget - weights - act) // (block_bytes / num_gpus))
    return complete_pools(config, num_gpu, block_bytes, recompute_scratch_blocks(config))


def _activation(config: EngineConfig, num_gpus: int, calib: Calibration | None,
                hw: HardwareProfile) -> float:
    """The measured non-weight, non-KV memory when the calibration saw this very setting,
    else the estimate."""
    m = calib.memory if calib is not None else {}
    same = (calib is not None and calib.hardware == hw.name and num_gpus == 1
            and m.get("max_num_batched_tokens") == config.scheduler.max_num_batched_tokens
            and m.get("max_model_len") == config.scheduler.max_model_len)
    if same and "reserved_bytes" in m:
        return float(m["reserved_bytes"])
    return float(activation_peak_bytes(config, num_gpus))
