"""Latency, throughput and SLO figures of one run, vLLM's definitions (benchmark_serving)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from kvtier.bench.backend import RequestRecord
from kvtier.bench.runner import RunResult

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Distribution:
    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Distribution | None:
        if len(values) == 0:
            return None
        a = np.asarray(values, dtype=float)
        # np.percentile's default (linear interpolation) is what vLLM reports.
        p50, p90, p99 = (float(np.percentile(a, q)) for q in PERCENTILES)
        return cls(len(a), float(a.mean()), p50, p90, p99, float(a.max()))


@dataclass(frozen=True)
class Slo:
    """Latency objectives in seconds; None leaves that dimension unconstrained."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met_by(self, r: RequestRecord) -> bool:
        """A request meets the SLO when it finished and both latencies are within bounds.
        One-token requests have no TPOT and meet that half trivially."""
        if not r.ok:
            return False
        ttft = r.ttft_s
        if self.ttft_s is not None and (ttft is None or ttft > self.ttft_s):
            return False
        tpot = r.tpot_s
        return self.tpot_s is None or tpot is None or tpot <= self.tpot_s


ATTAINMENT_BASIS = "requests sent (failed and aborted ones count as misses)"


def slo_attainment(records: Sequence[RequestRecord], slo: Slo) -> float:
    """Fraction of the requests sent inside the SLO: failed and aborted ones count as
    misses, requests the time limit left unsent do not count (they were never asked)."""
    sent = [r for r in records if r.sent]
    if not sent:
        return 0.0
    return sum(slo.met_by(r) for r in sent) / len(sent)


def slo_attainment_all(records: Sequence[RequestRecord], slo: Slo) -> float:
    """The strict figure: of the whole workload, never-sent requests counted as misses."""
    if not records:
        return 0.0
    return sum(slo.met_by(r) for r in records) / len(records)


def concurrency_timeline(records: Sequence[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """(times, in-flight requests from each time on): arrived and not yet finished."""
    events = [(r.arrival_s, 1) for r in records if r.finish_s is not None]
    events += [(r.finish_s, -1) for r in records if r.finish_s is not None]
    # At equal times, departures first: a request handing over to the next is not overlap.
    events.sort(key=lambda e: (e[0], e[1]))
    times = np.array([t for t, _ in events])
    counts = np.cumsum([d for _, d in events])
    return times, counts


def mean_concurrency(times: np.ndarray, counts: np.ndarray) -> float:
    """Time-weighted mean of the step function over [first event, last event]."""
    if len(times) < 2 or times[-1] <= times[0]:
        return 0.0
    return float(np.sum(counts[:-1] * np.diff(times)) / (times[-1] - times[0]))


@dataclass(frozen=True)
class Summary:
    num_requests: int  # the workload's
    num_completed: int  # finished normally
    duration_s: float
    request_throughput: float  # completed requests / s
    output_throughput: float  # output tokens / s
    total_token_throughput: float  # (prompt + output) tokens / s
    ttft_s: Distribution | None
    tpot_s: Distribution | None
    itl_s: Distribution | None
    e2e_s: Distribution | None
    mean_concurrency: float
    max_concurrency: int
    slo_attainment: float | None  # both SLOs, of the requests sent (ATTAINMENT_BASIS)
    ttft_attainment: float | None
    tpot_attainment: float | None
    slo_throughput: float | None  # requests inside both SLOs / s (vLLM's "request goodput")
    # What became of each request; sent = completed + aborted_at_limit + failed.
    num_sent: int
    num_aborted_at_limit: int  # sent, unfinished at --max-duration (the runner's abort)
    num_failed: int  # sent, ended with an error
    num_not_sent: int  # still due when --max-duration came
    slo_attainment_all: float | None  # both SLOs, of all requests: unsent ones miss
    # Prefix cache, per request as the backend reports it (RequestOutput.num_cached_tokens,
    # or the server's usage.prompt_tokens_details.cached_tokens), over completed requests;
    # None where the backend reports none.
    num_cached_tokens: int | None
    prefix_cache_hit_rate: float | None  # cached / prompt tokens of those requests
    attainment_basis: str = ATTAINMENT_BASIS
    # Arrival to first scheduled, where the backend reports it (the engine does; a server
    # client sees only its tokens): the waiting part of the TTFT.
    queue_s: Distribution | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(records: Sequence[RequestRecord], duration_s: float, slo: Slo | None = None) -> Summary:
    done = [r for r in records if r.ok]
    out_tokens = sum(r.output_len for r in done)
    all_tokens = out_tokens + sum(r.prompt_len for r in done)
    per_s = (lambda x: x / duration_s) if duration_s > 0 else (lambda x: 0.0)
    times, counts = concurrency_timeline(records)
    attain = None if slo is None else slo_attainment(records, slo)
    sent = [r for r in records if r.sent]
    aborted = sum(r.finish_reason == "abort" for r in sent)
    return Summary(
        num_requests=len(records),
        num_completed=len(done),
        duration_s=duration_s,
        request_throughput=per_s(len(done)),
        output_throughput=per_s(out_tokens),
        total_token_throughput=per_s(all_tokens),
        ttft_s=Distribution.of([t for r in done if (t := r.ttft_s) is not None]),
        tpot_s=Distribution.of([t for r in done if (t := r.tpot_s) is not None]),
        itl_s=Distribution.of([x for r in done for x in r.itls_s()]),
        e2e_s=Distribution.of([t for r in done if (t := r.e2e_s) is not None]),
        mean_concurrency=mean_concurrency(times, counts),
        max_concurrency=int(counts.max()) if len(counts) else 0,
        slo_attainment=attain,
        ttft_attainment=None if slo is None else slo_attainment(records, Slo(ttft_s=slo.ttft_s)),
        tpot_attainment=None if slo is None else slo_attainment(records, Slo(tpot_s=slo.tpot_s)),
        slo_throughput=None if slo is None else per_s(sum(slo.met_by(r) for r in sent)),
        num_sent=len(sent),
        num_aborted_at_limit=aborted,
        num_failed=len(sent) - len(done) - aborted,
        num_not_sent=len(records) - len(sent),
        slo_attainment_all=None if slo is None else slo_attainment_all(records, slo),
        **_cached_tokens(done),
        queue_s=Distribution.of([t for r in done if (t := r.queue_s) is not None]),
    )


def _cached_tokens(done: Sequence[RequestRecord]) -> dict:
    """Summary's prefix-cache fields, over the requests whose backend reported a count."""
    reported = [r for r in done if r.num_cached_tokens is not None]
    if not reported:
        return {"num_cached_tokens": None, "prefix_cache_hit_rate": None}
    cached = sum(r.num_cached_tokens or 0 for r in reported)
    prompt = sum(r.prompt_len for r in reported)
    return {"num_cached_tokens": cached, "prefix_cache_hit_rate": cached / prompt}


def summarize_run(result: RunResult, slo: Slo | None = None) -> Summary:
    return summarize(result.records, result.duration_s, slo)


_COUNTERS = (
    "num_preemptions_total",
    "num_swap_out_blocks_total",
    "num_swap_in_blocks_total",
    "num_recomputed_tokens_total",
    "num_prompt_tokens_total",
    "num_generation_tokens_total",
    "num_prefix_recompute_tokens_total",
    "num_restored_tokens_total",
    "num_prefix_cache_queries_total",
    "num_prefix_cache_hits_total",
    "num_prefix_cache_preempted_queries_total",
    "num_prefix_cache_preempted_hits_total",
    "num_prefix_cache_evicted_blocks_total",
)


def engine_summary(result: RunResult) -> dict:
    """What the engine did during the run: counter growth and KV use per tier."""
    if not result.steps or result.baseline is None:
        return {}
    out: dict = {name.removesuffix("_total"): result.counter_delta(name) for name in _COUNTERS}
    last = result.steps[-1].stats
    out["swapped_bytes"] = (out["num_swap_out_blocks"] + out["num_swap_in_blocks"]) * last.block_bytes
    queries = out["num_prefix_cache_queries"]  # the engine's count: new requests' lookups
    out["prefix_cache_hit_rate"] = out["num_prefix_cache_hits"] / queries if queries else None
    gpu = np.array([s.stats.gpu_blocks_used for s in result.steps], dtype=float)
    host = np.array([s.stats.host_blocks_used for s in result.steps], dtype=float)
    running = np.array([s.stats.num_running for s in result.steps], dtype=float)
    # Means over busy time: each sample holds for the step it follows (prefills are long).
    w = np.array([s.stats.step_time_s for s in result.steps], dtype=float)
    w = w if w.sum() > 0 else np.ones_like(w)
    out["num_steps"] = len(result.steps)
    out["gpu_blocks_total"] = last.gpu_blocks_total
    out["host_blocks_total"] = last.host_blocks_total
    out["mean_gpu_kv_use"] = float(np.average(gpu, weights=w) / last.gpu_blocks_total) if last.gpu_blocks_total else None
    out["max_gpu_blocks_used"] = int(gpu.max())
    out["max_host_blocks_used"] = int(host.max())
    out["mean_host_blocks_used"] = float(np.average(host, weights=w))
    out["mean_running"] = float(np.average(running, weights=w))
    out["max_running"] = int(running.max())
    out["max_waiting"] = max(s.stats.num_waiting for s in result.steps)
    out["max_swapped"] = max(s.stats.num_swapped for s in result.steps)
    out["mean_step_time_s"] = float(np.mean([s.stats.step_time_s for s in result.steps]))
    return out
