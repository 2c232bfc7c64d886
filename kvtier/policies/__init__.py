"""KV-memory policies, chosen by name (`kv_policy=` / `--kv-policy`)."""

from kvtier.config import PolicyOptions
from kvtier.policies import ellm as _ellm  # noqa: F401  (importing registers them)
from kvtier.policies import hcache as _hcache  # noqa: F401
from kvtier.policies import recompute as _recompute  # noqa: F401
from kvtier.policies import swap as _swap  # noqa: F401
from kvtier.policies.base import (
    KVPolicy,
    Preemption,
    get_policy,
    policy_names,
    register_policy,
)

__all__ = ["KVPolicy", "PolicyOptions", "Preemption", "get_policy", "policy_names",
           "register_policy"]
