"""The simulator's executor factory for `assemble` (kvtier/engine/assembly.py): a
SimulatedExecutor over the cost model of the simulated GPU, on a virtual clock, and KV pool
sizes of that GPU: the configured fraction of its memory (from the hardware profile instead
of asked of CUDA), minus weights and the activation peak, in whole blocks, completed by
`kvtier/engine/memory.py`'s shared rules.

Under tensor parallelism each GPU holds 1/n of the weights and of every block (KV heads are
split), so the pool holds n times the blocks one GPU's leftover memory would.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.config import ConfigError, EngineConfig
from kvtier.core.executor import Executor
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import GiB, HardwareProfile
from kvtier.costmodel.model import CostModel
from kvtier.engine.memory import PoolSizes, complete_pools, explicit_gpu_blocks
from kvtier.kv.manager import cdiv
from kvtier.policies import get_system, system_cost_config
from kvtier.policies.base import HostPools
from kvtier.sim.clock import VirtualClock
from kvtier.sim.executor import SimulatedExecutor
from kvtier.tokenizer import Tokenizer

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
                   calib: Calibration | None = None,
                   reserved_blocks: int | None = None) -> PoolSizes:
    """`reserved_blocks`: device blocks the memory system takes (None: what it asks for)."""
    cache, mc = config.cache, config.model_config
    block_bytes = cache.block_bytes(mc, BF16)
    check_weights_fit_sim(config, hw, num_gpus)
    num_gpu = explicit_gpu_blocks(config, block_bytes)
    if num_gpu is None:
        per_gpu_budget = hw.memory_bytes * cache.gpu_memory_utilization
        act = _activation(config, num_gpus, calib, hw)
        weights = weight_bytes(config) / num_gpus
        num_gpu = int((per_gpu_budget - weights - act) // (block_bytes / num_gpus))
    if reserved_blocks is None:
        reserved_blocks = get_system(config.kv_policy).reserved_device_blocks(config)
    return complete_pools(config, num_gpu, block_bytes, reserved_blocks)


def check_weights_fit_sim(config: EngineConfig, hw: HardwareProfile, num_gpus: int) -> None:
    cache = config.cache
    per_gpu_budget = hw.memory_bytes * cache.gpu_memory_utilization
    weights = weight_bytes(config) / num_gpus
    if weights > per_gpu_budget:
        raise ConfigError(f"model {config.model!r} needs {weights / GiB:.1f} GiB of weights per "
                          f"GPU, more than {cache.gpu_memory_utilization:.2f} x "
                          f"{hw.memory_bytes / GiB:.1f} GiB of the simulated {hw.name}")


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


class SimFactory:
    simulated = True
    dtype_bytes = BF16

    def __init__(self, hw: HardwareProfile, calib: Calibration | None, num_gpus: int,
                 clock: VirtualClock, output_lens: Mapping[str, int] | None = None,
                 record_steps: bool = False, plan_for: HardwareProfile | None = None,
                 overlap_host: bool = False):
        self.hw, self.calib, self.num_gpus, self.clock = hw, calib, num_gpus, clock
        self.output_lens, self.record_steps, self.plan_for = output_lens, record_steps, plan_for
        self.overlap_host = overlap_host  # steps priced as async scheduling overlaps them
        self._cost: CostModel | None = None

    def check(self, config: EngineConfig) -> None:
        return None  # the weights are checked against the simulated GPU with the pools

    def start(self, config: EngineConfig, ckpt: Any) -> None:
        return None

    def pricing_model(self, config: EngineConfig, block_bytes: int) -> CostModel:
        self._cost = CostModel(config.model_config, self.hw, self.calib,
                               system_cost_config(config, block_bytes, self.num_gpus))
        return self._cost

    def size_pools(self, config: EngineConfig, reserved_blocks: int) -> PoolSizes:
        return sim_pool_sizes(config, self.hw, self.num_gpus, self.calib, reserved_blocks)

    def executor(self, config: EngineConfig, tokenizer: Tokenizer) -> SimulatedExecutor:
        assert self._cost is not None
        mc = config.model_config
        eos = tuple(tokenizer.eos_token_ids) + tuple(mc.eos_token_ids)
        return SimulatedExecutor(self._cost, self.clock, ordinary_token(eos, mc.vocab_size),
                                 eos[0] if eos else None, self.output_lens, self.record_steps,
                                 overlap_host=self.overlap_host)

    def allocate(self, executor: Any, num_gpu_blocks: int, num_host_blocks: int,
                 reserved_blocks: int) -> None:
        return None

    def decode_graphs(self, executor: Executor) -> bool:
        assert isinstance(executor, SimulatedExecutor)
        return bool(executor.cost_model.graph_sizes)

    def describe(self, config: EngineConfig, pools: PoolSizes, host: HostPools) -> str:
        calib = self.calib
        return (f"kvtier sim: {config.model} on {self.num_gpus} x {self.hw.name} "
                f"({f'calibrated on {calib.hardware}' if calib else 'uncalibrated roofline'}), "
                f"{pools.num_gpu_blocks} device + {pools.num_host_blocks} host KV blocks, "
                f"policy {config.kv_policy}")


def ordinary_token(eos: tuple[int, ...], vocab_size: int) -> int:
    """A token id that ends nothing: the simulated model's every output."""
    banned = set(eos)
    return next(t for t in range(min(1000, vocab_size - 1), vocab_size) if t not in banned)
