"""Memory systems, chosen by name (`kv_policy=` / `--kv-policy`): one package each
(`kvtier/policies/<name>/`); base.py holds the hooks shared code calls them through."""

import kvtier.offload as _offload  # noqa: F401  (the host tier's plan items)
from kvtier.policies import directkv as _directkv  # noqa: F401  (importing registers them)
from kvtier.policies import ellm as _ellm  # noqa: F401
from kvtier.policies import hcache as _hcache  # noqa: F401
from kvtier.policies import neo as _neo  # noqa: F401
from kvtier.policies import recompute as _recompute  # noqa: F401
from kvtier.policies import swap as _swap  # noqa: F401
from kvtier.policies.base import KVPolicy, MemorySystem, Preemption
from kvtier.policies.registry import (
    demo_policies,
    get_policy,
    get_system,
    policy_names,
    register_system,
    system_cost_config,
    unregister_system,
)

__all__ = ["KVPolicy", "MemorySystem", "Preemption", "demo_policies", "get_policy", "get_system",
           "policy_names", "register_system", "system_cost_config", "unregister_system"]
