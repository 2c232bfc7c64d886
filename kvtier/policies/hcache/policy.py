"""HCache (EuroSys'25) as a preemption policy: a preempted request keeps its per-layer
hidden states instead of its KV and comes back by re-projecting K/V from them (one GEMM per
layer, no attention, no MLP). Every token the request computes has its hidden states stored
as it is computed (`kvtier/policies/hcache/store.py`); a request whose store ran out falls
back to recompute.

With a prefix cache: the tokens of a cache hit were computed by another request and have no
hidden states here. Hiding releases the request's reference to every device block, shared
ones included (their cache keeps them; docs/PREFIX_CACHE.md says why not pin them); coming
back, it takes back the leading blocks still cached and re-projects only the rest. If part
of its hit was evicted meanwhile, nothing but a forward can rebuild that part: it keeps the
blocks it took back and recomputes from there (a prefill).
The store is h values per token per layer against K+V's 2 x kv_heads x head_dim: smaller
only for MHA models (Llama 2), twice as large for GQA ones with 8 of 32 KV heads."""

from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import (
    KVPolicy,
    Preemption,
    PreemptionKind,
    Resume,
    drop_kv,
)


class HCachePolicy(KVPolicy):
    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        if kv.hidden is None or not kv.hidden.covers(req.request_id, req.num_computed_tokens):
            return drop_kv(req, kv)  # no store, or it ran out for this request
        kv.hide(req)
        req.status = RequestStatus.SWAPPED
        return Preemption(PreemptionKind.HIDDEN)

    def can_resume(self, req: Request, kv: KVCacheManager, num_new_tokens: int,
                   use_watermark: bool = True) -> bool:
        return kv.can_unhide(req, num_new_tokens, use_watermark)

    def resume(self, req: Request, kv: KVCacheManager) -> Resume:
        assert kv.hidden is not None
        reused = kv.reusable_prefix(req)[0] * kv.block_size
        if reused >= kv.hidden.first_token(req.request_id):
            start = kv.unhide(req)
            return Resume(restore_tokens=req.num_computed_tokens - start, restore_from=start)
        # Part of its cache hit was evicted: those tokens have no hidden states.
        req.num_computed_tokens = kv.unhide(req, restore=False)
        return Resume()
