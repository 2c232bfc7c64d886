"""Cache-aware admission for the waiting queue's head, as the scheduler's
`admission_gate`. Torch-free: the simulator runs it as it is.

  * Delayed hits: when the first block the request would have to compute (past its device
    and host hits) is one a running request is still computing, the request waits for it
    instead of computing it a second time; the next steps find it cached.
  * Balanced batches (a `loading_bound`): a step loads at most `loading_bound` times
    the tokens it computes (counting the request's own uncached suffix), so loads do not
    stretch a step that has little to compute them behind; a step's first load always
    goes (an idle engine never waits for compute to hide a load behind).
  * Bubble filling (`prefetch`): a request that waits this step anyway (for a delayed hit,
    for load room, or behind the step's admissions in the queue) has its host hit loaded in
    the step's background, into the device tier (the step's decodes and chunks do not wait
    for it); when admitted it hits those blocks on the device. A request that can be
    admitted now is never held back to prefetch it: it loads its hit inline, layer by layer
    behind its own prefill. Behind the queue's head, the requests the next step could admit
    are prefetched (in queue order, up to a step's tokens of theirs to compute). Once per
    request: if its prefetched blocks are evicted before it is admitted, it loads them the
    ordinary way.
FCFS is kept: a head that waits holds the queue for a step, and the running requests'
decodes and prefill chunks keep running meanwhile.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from weakref import WeakKeyDictionary

from kvtier.core.request import Request, RequestStatus
from kvtier.kv.block_hash import BlockHash
from kvtier.kv.host_tier import HostTier
from kvtier.kv.manager import KVCacheManager


@dataclass
class AdmissionStats:
    delayed_requests: int = 0  # requests that waited for a prefix being computed
    delayed_hit_tokens: int = 0  # tokens they found cached after waiting (not recomputed)
    delayed_steps: int = 0  # admissions put off for a prefix being computed
    load_bound_steps: int = 0  # admissions put off by the loading bound
    prefetches: int = 0  # requests whose host hit was loaded while they waited


class CacheAwareAdmission:
    def __init__(self, kv: KVCacheManager, tier: HostTier, loading_bound: float,
                 delayed_hits: bool, prefetch: bool = False):
        assert kv.prefix_cache is not None
        self.kv, self.cache, self.tier = kv, kv.prefix_cache, tier
        self.loading_bound, self.delayed_hits = loading_bound, delayed_hits
        self.prefetch = prefetch
        self._prefetched: WeakKeyDictionary[Request, int] = WeakKeyDictionary()
        # request -> blocks cached when it first waited (weak: an abort takes it along)
        self._waited: WeakKeyDictionary[Request, int] = WeakKeyDictionary()
        self.stats = AdmissionStats()
        # Requests asked this step: a step whose waiting queue is walked twice (priority,
        # with swapped requests between the passes) puts a request off once, not twice.
        self._asked: set[str] = set()  # request ids (an aborted request is not kept alive)

    def begin_step(self) -> None:
        self._asked.clear()

    def admit_now(self, req: Request, running: list[Request], num_step_tokens: int) -> bool:
        hashes, n_device = self.cache.admission_hashes(req)
        n_host = self._host_run(hashes, n_device)
        # A host hit shorter than the tier's minimum is computed, not loaded (HostTier.extend):
        # it neither counts against the loading bound nor ends where the request computes.
        n_load = n_host if self.tier.worth_loading(n_host) else 0
        cached = n_device + n_load
        delayed = (self.delayed_hits and cached < len(hashes)
                   and hashes[cached] in self._computing(running))
        first_ask = req.request_id not in self._asked
        self._asked.add(req.request_id)
        if delayed:
            if req not in self._waited:
                self._waited[req] = cached
                self.stats.delayed_requests += 1
            self.stats.delayed_steps += first_ask
        over = (not delayed and n_load > 0
                and self._over_bound(req, n_load, cached, num_step_tokens))
        if delayed or over:  # it waits this step: its hit may load meanwhile
            self._prefetch(req, hashes, n_device, n_host)
        if delayed:
            return False
        if over:
            self.stats.load_bound_steps += first_ask
            return False
        first = self._waited.pop(req, None)
        if first is not None:
            self.stats.delayed_hit_tokens += (cached - first) * self.kv.block_size
        return True

    def fill_bubbles(self, waiting: Iterable[Request], step_tokens: int) -> None:
        """After a step's admissions: the requests still waiting wait at least this step, so
        those the next step could admit (in queue order, until their tokens to compute
        reach `step_tokens`) load their host hits in this step's background."""
        if not self.prefetch:
            return
        bs = self.kv.block_size
        for req in waiting:
            if step_tokens <= 0:
                return
            hashes, n_device = self.cache.admission_hashes(req)
            n_host = self._host_run(hashes, n_device)
            step_tokens -= req.num_tokens - (n_device + n_host) * bs
            if n_host:
                self._prefetch(req, hashes, n_device, n_host)

    def _prefetch(self, req: Request, hashes: list[BlockHash], n_device: int,
                  n_host: int) -> None:
        """Load hashes[n_device:n_device + n_host], once a request (a try that found no
        room is tried again); the blocks its device hit takes are kept out of the eviction
        that makes their room (else it evicts its own hit)."""
        if not self.prefetch or not n_host or req in self._prefetched:
            return
        keep = self.cache.touch(hashes[:n_device]) * self.kv.num_groups
        got = self.tier.prefetch(hashes[n_device:n_device + n_host], self.kv, keep)
        if got:
            self._prefetched[req] = got
            self.stats.prefetches += 1

    def _host_run(self, hashes: list[BlockHash], n_device: int) -> int:
        """How many blocks past the device hit the host tier holds, in a run."""
        return self.tier.held_run(hashes[n_device:])

    def _over_bound(self, req: Request, n_host: int, cached: int, num_step_tokens: int) -> bool:
        if not self.loading_bound:
            return False
        planned = self.tier.num_planned_load_blocks
        if not planned:
            return False
        bs = self.kv.block_size
        compute = num_step_tokens + req.num_tokens - cached * bs
        return (planned + n_host) * bs > self.loading_bound * compute

    def _computing(self, running: list[Request]) -> set[BlockHash]:
        """Blocks running requests are still to compute of their prompts (their hashes were
        made at their admission)."""
        out: set[BlockHash] = set()
        bs = self.kv.block_size
        for r in running:
            if r.status is not RequestStatus.RUNNING or \
                    r.num_computed_tokens >= r.num_prompt_tokens:
                continue
            hashes, _ = self.cache.admission_hashes(r)
            out.update(hashes[r.num_computed_tokens // bs:])
        return out
