"""Full cache + preempt-recompute (vLLM V1)."""

from kvtier.core.request import Request
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import KVPolicy, Preemption, drop_kv


class RecomputePolicy(KVPolicy):
    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        return drop_kv(req, kv)
