"""The prefix cache's counters (kvtier/kv/prefix_cache.py counts them; the engine's stats and
metrics read them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PrefixCacheStats:
    """Lookups in tokens, as vLLM counts them (`prefix_cache_queries` / `_hits`): one per
    admission of a request (a retried admission replaces its earlier count), new requests
    apart from re-admissions after preemption."""

    requests: int = 0
    queries: int = 0  # tokens of the requests looked up
    hits: int = 0  # of them, tokens whose KV was cached
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    evicted_blocks: int = 0  # token blocks evicted (each = num_groups device blocks)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0
