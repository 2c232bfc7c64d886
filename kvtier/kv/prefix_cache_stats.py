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

    def count_lookup(self, preempted: bool, queried: int, hit: int,
                     retry_of: tuple[int, int] | None) -> None:
        """One admission's lookup (tokens queried, hit); `retry_of`: the (queried, hit) of
        the earlier try it replaces (that one did not fit)."""
        if retry_of is not None:
            self._add(preempted, -retry_of[0], -retry_of[1])
        elif preempted:
            self.preempted_requests += 1
        else:
            self.requests += 1
        self._add(preempted, queried, hit)

    def _add(self, preempted: bool, queried: int, hit: int) -> None:
        if preempted:
            self.preempted_queries += queried
            self.preempted_hits += hit
        else:
            self.queries += queried
            self.hits += hit
