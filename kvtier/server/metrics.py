"""Prometheus metrics of one server, in its own registry (tests build several apps).

Gauges and engine counters are read from the worker's latest `EngineStats` snapshot at
scrape time; latency histograms are observed on the worker when a request finishes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kvtier.engine.outputs import EngineStats
from kvtier.offload.metrics import host_tier_families
from kvtier.server.updates import RequestUpdate

if TYPE_CHECKING:
    from kvtier.server.async_engine import AsyncEngine

P = "kvtier:"

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                50.0, 60.0, 120.0, 240.0)

# vLLM's phases of a request (name, RequestMetrics' start and end stamps, help): waiting,
# its prefill (to the first token), its decode (first token to finish), and the two together.
_PHASES = (("queue", "arrival_time", "first_scheduled_time", "Arrival to first scheduled."),
           ("prefill", "first_scheduled_time", "first_token_time",
            "First scheduled to first token."),
           ("decode", "first_token_time", "finished_time", "First token to finish."),
           ("inference", "first_scheduled_time", "finished_time", "First scheduled to finish."))


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(f"{P}time_to_first_token_seconds", "Time to first token.",
                              buckets=_TTFT_BUCKETS, registry=r)
        self.tpot = Histogram(f"{P}time_per_output_token_seconds",
                              "Mean time per output token after the first, per request.",
                              buckets=_TPOT_BUCKETS, registry=r)
        self.e2e = Histogram(f"{P}e2e_request_latency_seconds", "Arrival to finish.",
                             buckets=_E2E_BUCKETS, registry=r)
        self.phases = {
            name: (Histogram(f"{P}request_{name}_time_seconds", text, buckets=_E2E_BUCKETS,
                             registry=r), start, end)
            for name, start, end, text in _PHASES}
        self.sequences_finished = Counter(f"{P}request_success",
                                          "Finished sequences by finish reason.",
                                          ["finished_reason"], registry=r)
        self.requests_rejected = Counter(f"{P}request_rejected",
                                         "Requests refused with 503 (waiting queue full).",
                                         registry=r)
        self.requests_aborted = Counter(f"{P}request_client_aborted",
                                        "Engine requests aborted because the client left.",
                                        registry=r)

    def attach(self, async_engine: AsyncEngine) -> None:
        self.registry.register(_EngineCollector(async_engine))

    def observe(self, update: RequestUpdate) -> None:
        """Called on the worker thread for every update (prometheus-client is thread-safe)."""
        for seq in update.seqs:
            if seq.finish_reason is not None:
                self.sequences_finished.labels(seq.finish_reason).inc()
        m = update.metrics
        if not update.finished or m is None:
            return
        if m.first_token_time is not None:
            self.ttft.observe(m.first_token_time - m.arrival_time)
        if m.finished_time is not None:
            self.e2e.observe(m.finished_time - m.arrival_time)
        for hist, start_field, end_field in self.phases.values():
            start, end = getattr(m, start_field), getattr(m, end_field)
            if start is not None and end is not None:
                hist.observe(end - start)
        times = m.token_times
        if len(times) >= 2:
            self.tpot.observe((times[-1] - times[0]) / (len(times) - 1))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    def __init__(self, async_engine: AsyncEngine) -> None:
        self._engine = async_engine

    def describe(self) -> list[Metric]:
        return []  # dynamic: do not call collect() at registration time

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(f"{P}num_requests_pending",
                                "Requests accepted by the server that have no token yet.",
                                value=self._engine.num_pending)
        yield GaugeMetricFamily(f"{P}engine_healthy", "1 while the step loop runs.",
                                value=float(self._engine.is_healthy))
        s = self._engine.stats
        if s is None:
            return
        yield GaugeMetricFamily(f"{P}num_requests_running", "Running requests.", value=s.num_running)
        yield GaugeMetricFamily(f"{P}num_requests_waiting", "Waiting requests.", value=s.num_waiting)
        yield GaugeMetricFamily(f"{P}num_requests_swapped", "Swapped-out requests.", value=s.num_swapped)
        yield _per_tier(f"{P}kv_blocks_used", "KV blocks in use.", s.gpu_blocks_used, s.host_blocks_used)
        yield _per_tier(f"{P}kv_blocks_total", "KV blocks in the pool.", s.gpu_blocks_total, s.host_blocks_total)
        yield GaugeMetricFamily(f"{P}num_scheduled_tokens", "Tokens computed in the last step.",
                                value=s.num_scheduled_tokens)
        yield GaugeMetricFamily(f"{P}num_scheduled_requests", "Requests computed in the last step.",
                                value=s.num_scheduled_requests)
        yield GaugeMetricFamily(f"{P}num_dropped_tokens",
                                "Tokens of running requests whose KV prefix is dropped (recomputed each step).",
                                value=s.num_dropped_tokens)
        yield GaugeMetricFamily(f"{P}step_time_seconds", "Wall time of the last step.", value=s.step_time_s)
        yield GaugeMetricFamily(f"{P}kv_block_bytes", "Bytes of one KV block.", value=s.block_bytes)
        usage = s.gpu_blocks_used / s.gpu_blocks_total if s.gpu_blocks_total else 0.0
        yield GaugeMetricFamily(f"{P}gpu_cache_usage_perc",
                                "Fraction of GPU KV blocks held by requests (cached blocks "
                                "nobody holds count as free, as vLLM's).", value=usage)
        yield GaugeMetricFamily(f"{P}kv_blocks_cached",
                                "GPU KV blocks only the prefix cache holds (evictable).",
                                value=s.gpu_blocks_cached)
        yield from _prefix_cache_metrics(s)
        counters = {
            "num_preemptions": ("Preemptions.", s.num_preemptions_total),
            "recomputed_tokens": ("Tokens prefilled again after preemption.", s.num_recomputed_tokens_total),
            "swap_out_blocks": ("Blocks swapped out to host.", s.num_swap_out_blocks_total),
            "swap_in_blocks": ("Blocks swapped in from host.", s.num_swap_in_blocks_total),
            "prompt_tokens": ("Prompt tokens processed.", s.num_prompt_tokens_total),
            "generation_tokens": ("Generated tokens.", s.num_generation_tokens_total),
            "prefix_recompute_tokens": ("Dropped-prefix tokens recomputed.",
                                        s.num_prefix_recompute_tokens_total),
            "restored_tokens": ("Tokens whose KV was re-projected from hidden states.",
                                s.num_restored_tokens_total),
        }
        for name, (doc, value) in counters.items():
            yield CounterMetricFamily(f"{P}{name}", doc, value=value)
        if s.host_tier is not None:
            yield from host_tier_families(s.host_tier)


# vLLM's prefix-cache counters, in tokens, of new requests (hit rate = rate(hits) /
# rate(queries)); re-admissions after preemption apart, so recompute does not inflate it.
_PREFIX_CACHE_COUNTERS = {
    "prefix_cache_queries": ("Prompt tokens looked up in the prefix cache (new requests).",
                             "num_prefix_cache_queries_total"),
    "prefix_cache_hits": ("Of them, tokens whose KV the prefix cache supplied.",
                          "num_prefix_cache_hits_total"),
    "prefix_cache_preempted_queries": ("Tokens looked up on re-admission after preemption.",
                                       "num_prefix_cache_preempted_queries_total"),
    "prefix_cache_preempted_hits": ("Of them, tokens the prefix cache supplied.",
                                    "num_prefix_cache_preempted_hits_total"),
    "prefix_cache_evicted_blocks": ("Cached token blocks evicted to make room.",
                                    "num_prefix_cache_evicted_blocks_total"),
}


def _prefix_cache_metrics(s: EngineStats) -> Iterator[Metric]:
    for name, (doc, field_name) in _PREFIX_CACHE_COUNTERS.items():
        yield CounterMetricFamily(f"{P}{name}", doc, value=getattr(s, field_name))
    queries, hits = s.num_prefix_cache_queries_total, s.num_prefix_cache_hits_total
    yield GaugeMetricFamily(f"{P}prefix_cache_hit_rate",
                            "prefix_cache_hits / prefix_cache_queries since the start.",
                            value=hits / queries if queries else 0.0)


def stats_from_metrics(text: str) -> EngineStats | None:
    """The `EngineStats` a /metrics page describes (None before the engine reported any)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            tier = sample.labels.get("tier")
            values[sample.name + (f"/{tier}" if tier else "")] = sample.value
    if f"{P}num_requests_running" not in values:
        return None

    def v(name: str) -> int:
        return int(values.get(P + name, 0))

    counters: dict[str, Any] = {field_name: v(f"{name}_total")
                                for name, (_, field_name) in _PREFIX_CACHE_COUNTERS.items()}
    return EngineStats(
        num_running=v("num_requests_running"),
        num_waiting=v("num_requests_waiting"),
        num_swapped=v("num_requests_swapped"),
        gpu_blocks_used=v("kv_blocks_used/gpu"),
        gpu_blocks_total=v("kv_blocks_total/gpu"),
        host_blocks_used=v("kv_blocks_used/host"),
        host_blocks_total=v("kv_blocks_total/host"),
        num_preemptions_total=v("num_preemptions_total"),
        num_swap_out_blocks_total=v("swap_out_blocks_total"),
        num_swap_in_blocks_total=v("swap_in_blocks_total"),
        num_recomputed_tokens_total=v("recomputed_tokens_total"),
        num_prompt_tokens_total=v("prompt_tokens_total"),
        num_generation_tokens_total=v("generation_tokens_total"),
        num_scheduled_tokens=v("num_scheduled_tokens"),
        block_bytes=v("kv_block_bytes"),
        step_time_s=values.get(f"{P}step_time_seconds", 0.0),
        num_scheduled_requests=v("num_scheduled_requests"),
        num_prefix_recompute_tokens_total=v("prefix_recompute_tokens_total"),
        num_dropped_tokens=v("num_dropped_tokens"),
        num_restored_tokens_total=v("restored_tokens_total"),
        gpu_blocks_cached=v("kv_blocks_cached"),
        **counters,
    )


def _per_tier(name: str, doc: str, gpu: int, host: int) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=["tier"])
    family.add_metric(["gpu"], gpu)
    family.add_metric(["host"], host)
    return family
