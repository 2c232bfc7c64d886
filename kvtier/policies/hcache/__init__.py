"""HCache: a preempted request keeps its per-layer hidden states instead of its KV and comes
back by re-projecting K/V from them (policy.py); the host store of hidden states (store.py)
and its tensors in the runner (runner_states.py); its assembly: the swap space holds hidden
states, not KV, and the runner captures them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvtier.config import EngineConfig
from kvtier.policies.base import HostPools, MemorySystem
from kvtier.policies.hcache.policy import HCachePolicy
from kvtier.policies.hcache.store import HiddenStore
from kvtier.policies.options import SystemArgs
from kvtier.policies.registry import register_system

if TYPE_CHECKING:
    from kvtier.engine.assembly import AssemblyContext

GiB = 1 << 30


@dataclass(frozen=True)
class HCacheArgs(SystemArgs):
    prefix = "hcache"
    num_hidden_blocks: int | None = field(
        default=None, metadata={"dest": "num_hidden_blocks",
                                "help": "hcache: host hidden-state blocks (default: --swap-space)"})


@register_system
class HCacheSystem(MemorySystem):
    name = "hcache"
    policy = HCachePolicy
    args = HCacheArgs

    def host_pools(self, config: EngineConfig, ctx: AssemblyContext,
                   num_host_blocks: int) -> HostPools:
        """The swap space holds hidden states, not KV."""
        args = ctx.system_args
        assert isinstance(args, HCacheArgs)
        n = args.num_hidden_blocks or hidden_blocks_for(config, ctx.dtype_bytes)
        return HostPools(num_host_blocks=0, num_state_blocks=n)

    def kv_manager_options(self, config: EngineConfig, pools: HostPools) -> dict[str, Any]:
        assert pools.num_state_blocks is not None
        return {"hidden_store": HiddenStore(pools.num_state_blocks, config.cache.block_size)}

    def prepare_executor(self, executor: Any, ctx: AssemblyContext, pools: HostPools) -> None:
        """The runner captures every layer's attention input (the simulator prices it)."""
        if ctx.simulated:
            executor.captures_hidden = True
            return
        from kvtier.policies.hcache.runner_states import HiddenStates

        sched = executor.config.scheduler
        assert pools.num_state_blocks is not None
        executor.attach_layer_inputs(HiddenStates(
            executor.model, pools.num_state_blocks, executor.block_size, sched.max_num_seqs,
            executor.block_tables.table.shape[2], sched.max_num_batched_tokens,
            executor.dtype, executor.device))

    def cost_model_options(self, config: EngineConfig) -> dict[str, Any]:
        # Its steps all replay pieces: a piece hands each layer's input to the host.
        return {"decode_graphs": False}


def hidden_blocks_for(config: EngineConfig, dtype_bytes: int) -> int:
    """Hidden-state blocks (every layer x block_size tokens x hidden) in the swap space."""
    mc, bs = config.model_config, config.cache.block_size
    block_bytes = mc.num_layers * bs * mc.hidden_size * dtype_bytes
    return max(1, int(config.cache.swap_space_gb * GiB // block_bytes))


__all__ = ["HCacheArgs", "HCachePolicy", "HCacheSystem", "HiddenStore", "hidden_blocks_for"]
