"""The host tier's counters as one snapshot (`EngineStats.host_tier`), and as Prometheus
families for /metrics: per-tier hit rates, bytes each way and the rate achieved, the time
the forward stood still waiting for loads, and the delayed hits cache-aware admission won."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvtier.kv.host_tier import HostTier
from kvtier.kv.manager import KVCacheManager
from kvtier.offload.copy_times import CopyTimes, PricedCopyTimer

P = "kvtier:"


@dataclass(frozen=True)
class HostTierMetrics:
    queried_tokens: int  # of new requests' admissions (the device tier's count)
    gpu_hit_tokens: int
    host_hit_tokens: int  # loaded from the host tier on admission instead of computed
    prefetched_tokens: int  # loaded while their request waited (then gpu hits)
    stored_bytes: int
    loaded_bytes: int
    store_seconds: float  # copy-stream time of the stores (GPU: events; CPU: wall; sim: priced)
    load_seconds: float
    load_stall_seconds: float  # the forward's waits for loads
    host_blocks_used: int  # token blocks held
    host_blocks_total: int
    host_evicted_blocks: int
    skipped_stores: int
    delayed_requests: int
    delayed_hit_tokens: int  # tokens found cached after waiting: computed once, not twice
    load_bound_deferrals: int

    @property
    def gpu_hit_rate(self) -> float:
        return self.gpu_hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def host_hit_rate(self) -> float:
        return self.host_hit_tokens / self.queried_tokens if self.queried_tokens else 0.0

    @property
    def store_gb_per_s(self) -> float:
        return self.stored_bytes / self.store_seconds / 1e9 if self.store_seconds else 0.0

    @property
    def load_gb_per_s(self) -> float:
        return self.loaded_bytes / self.load_seconds / 1e9 if self.load_seconds else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "gpu_hit_rate": self.gpu_hit_rate,
                "host_hit_rate": self.host_hit_rate, "store_gb_per_s": self.store_gb_per_s,
                "load_gb_per_s": self.load_gb_per_s}


def host_tier_metrics(kv: KVCacheManager, executor: Any, gate: Any,
                      page_bytes: int) -> HostTierMetrics | None:
    """None without a host tier. `page_bytes`: one device block (one host page)."""
    pc = kv.prefix_cache
    tier = pc.lower if pc is not None else None
    if pc is None or not isinstance(tier, HostTier):
        return None
    times = copy_times(executor)
    ts, admission = tier.stats, getattr(gate, "stats", None)
    return HostTierMetrics(
        queried_tokens=pc.stats.queries, gpu_hit_tokens=pc.stats.hits,
        host_hit_tokens=ts.hit_blocks * kv.block_size,
        prefetched_tokens=ts.prefetched_blocks * kv.block_size,
        stored_bytes=ts.stored_pages * page_bytes, loaded_bytes=ts.loaded_pages * page_bytes,
        store_seconds=times.store_s if times else 0.0,
        load_seconds=times.load_s if times else 0.0,
        load_stall_seconds=times.stall_s if times else 0.0,
        host_blocks_used=len(tier.index), host_blocks_total=tier.pool.num_blocks // kv.num_groups,
        host_evicted_blocks=ts.evicted_blocks, skipped_stores=ts.skipped_stores,
        delayed_requests=admission.delayed_requests if admission else 0,
        delayed_hit_tokens=admission.delayed_hit_tokens if admission else 0,
        load_bound_deferrals=admission.load_bound_steps if admission else 0)


def copy_times(executor: Any) -> CopyTimes | None:
    """The copy-time record: the runner's (CUDA events, or wall time on the CPU) or the
    simulated executor's (the cost model's prices); None without either."""
    copies = getattr(getattr(executor, "copies", None), "tier", None)
    if copies is not None:
        return copies.timer.times
    priced = [o for o in getattr(executor, "observers", ()) if isinstance(o, PricedCopyTimer)]
    return priced[0].times if priced else None


def host_tier_families(m: HostTierMetrics) -> Iterator[Metric]:
    hits = CounterMetricFamily(f"{P}prefix_cache_tier_hits", "Prompt tokens whose KV a "
                               "cache tier supplied.", labels=["tier"])
    hits.add_metric(["gpu"], m.gpu_hit_tokens)
    hits.add_metric(["host"], m.host_hit_tokens)
    yield hits
    moved = CounterMetricFamily(f"{P}host_tier_bytes", "Bytes copied by the host tier.",
                                labels=["direction"])
    moved.add_metric(["store"], m.stored_bytes)
    moved.add_metric(["load"], m.loaded_bytes)
    yield moved
    secs = CounterMetricFamily(f"{P}host_tier_copy_seconds", "Copy time of the host tier's "
                               "stores and loads.", labels=["direction"])
    secs.add_metric(["store"], m.store_seconds)
    secs.add_metric(["load"], m.load_seconds)
    yield secs
    counters = {
        "host_tier_load_stall_seconds": ("Time the forward waited for host-tier loads.",
                                         m.load_stall_seconds),
        "host_tier_evicted_blocks": ("Token blocks the host tier evicted.",
                                     m.host_evicted_blocks),
        "host_tier_delayed_hit_tokens": ("Tokens hit after waiting for another request to "
                                         "compute them.", m.delayed_hit_tokens),
    }
    for name, (doc, value) in counters.items():
        yield CounterMetricFamily(f"{P}{name}", doc, value=value)
    yield GaugeMetricFamily(f"{P}host_tier_blocks_used", "Token blocks in the host tier.",
                            value=m.host_blocks_used)
    yield GaugeMetricFamily(f"{P}host_tier_blocks_total", "Token blocks the host tier holds.",
                            value=m.host_blocks_total)
    yield GaugeMetricFamily(f"{P}host_tier_load_gb_per_s", "Achieved host-tier load rate.",
                            value=m.load_gb_per_s)
