"""The executor factory of one tensor-parallel rank for `assemble`: RunnerFactory's, with the
runner built as a rank (its shard's model and KV heads) and the pools sized per rank, then
cut to what every rank can hold (the KV manager, in the driver, hands out the same block
ids to all of them)."""

from __future__ import annotations

import os
from typing import Any

import torch

from kvtier.config import EngineConfig
from kvtier.distributed.parallel_state import TPGroup
from kvtier.distributed.rank import TPRank
from kvtier.distributed.sharding import TPShard, check_tp
from kvtier.engine.memory import PoolSizes, check_weights_fit, size_pools
from kvtier.engine.runner_factory import RunnerFactory
from kvtier.policies.base import HostPools


class TPRunnerFactory(RunnerFactory):
    def __init__(self, device: str, dtype: str, rank: int, size: int, port: int):
        """Joins the group: returns once every rank has (the rendezvous at `port`)."""
        super().__init__(device, dtype)
        if self.device.type == "cuda":  # rank r drives GPU r
            self.device = torch.device("cuda", rank)
            torch.cuda.set_device(self.device)
        self._threads = torch.get_num_threads()
        if self.device.type == "cpu":  # the ranks share the cores: N whole OpenMP pools spin
            torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // size))  # on each other
        self.group = TPGroup(rank, size, port, self.device)

    def close(self) -> None:
        """Leave the group; this process's thread count back to what it was."""
        self.group.destroy()
        torch.set_num_threads(self._threads)

    def _per_rank(self, config: EngineConfig) -> EngineConfig:
        shard = TPShard(config.model_config, self.group.rank, self.group.size)
        return config.with_(model_config=shard.config())

    def check(self, config: EngineConfig) -> None:
        check_tp(config.model_config, self.group.size)
        check_weights_fit(self._per_rank(config), self.device, self.dtype)

    def start(self, config: EngineConfig, ckpt: Any) -> None:
        from kvtier.runner.model_runner import ModelRunner

        self._runner = ModelRunner(config, ckpt, self.device, self.dtype,
                                   tp=TPRank(self.group))
        self._peak = self._runner.profile_activation_peak()  # a forward run by every rank

    def size_pools(self, config: EngineConfig, reserved_blocks: int) -> PoolSizes:
        """This rank's blocks (its KV heads: 1/N of a block, or a replicated head), from its
        own memory; then the fewest any rank can hold, the same on every rank."""
        mine = size_pools(self._per_rank(config), self.device, self.dtype, self._peak,
                          reserved_blocks=reserved_blocks)
        gpu, host = self.group.min_ints([mine.num_gpu_blocks, mine.num_host_blocks])
        return PoolSizes(gpu, host, mine.block_bytes)

    def describe(self, config: EngineConfig, pools: PoolSizes, host: HostPools) -> str:
        return (super().describe(config, pools, host)
                + f"; tensor-parallel rank {self.group.rank} of {self.group.size} "
                  "(blocks and sizes per rank)")
