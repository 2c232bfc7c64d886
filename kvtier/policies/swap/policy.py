"""Full cache + preempt-swap (vLLM V0): the victim's blocks go to the host pool and come back.
When the host pool is full too, the victim is recomputed instead (nothing else is possible)."""

from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import KVPolicy, Preemption, PreemptionKind, drop_kv


class SwapPolicy(KVPolicy):
    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        copies = kv.swap_out(req)
        if copies is None:
            return drop_kv(req, kv)
        req.status = RequestStatus.SWAPPED
        return Preemption(PreemptionKind.SWAP, copies=copies)
