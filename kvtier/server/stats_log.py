"""The engine's periodic log line, as vLLM's server writes it (`--disable-log-stats` turns it
off): prompt and generation throughput over the interval, running and waiting requests, KV
usage of each tier, and the prefix cache's hit rate over the interval.

    Avg prompt throughput: P tokens/s, Avg generation throughput: G tokens/s,
    Running: R reqs, Waiting: W reqs, GPU KV cache usage: U%, Prefix cache hit rate: H%

then kvtier's own fields (host KV usage, swapped requests) where they apply. The hit rate is
that of the latest interval with look-ups (an interval without keeps the last one). An idle
engine logs once, then stays quiet until something changes.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from kvtier.engine.outputs import EngineStats

logger = logging.getLogger("kvtier.stats")

INTERVAL_ENV = "KVTIER_LOG_STATS_INTERVAL"
DEFAULT_INTERVAL_S = 10.0  # vLLM's VLLM_LOG_STATS_INTERVAL default


def interval_from_env(environ: dict[str, str] | None = None) -> float:
    env = os.environ if environ is None else environ
    raw = env.get(INTERVAL_ENV)
    if raw is None:
        return DEFAULT_INTERVAL_S
    try:
        value = float(raw)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise ValueError(f"${INTERVAL_ENV} must be a number of seconds > 0, got {raw!r}")
    return value


@dataclass
class _Mark:
    time_s: float
    prompt_tokens: int
    generation_tokens: int
    queries: int
    hits: int


def _mark(stats: EngineStats | None, now: float) -> _Mark:
    if stats is None:  # before the first step: nothing counted yet
        return _Mark(now, 0, 0, 0, 0)
    return _Mark(now, stats.num_prompt_tokens_total, stats.num_generation_tokens_total,
                 stats.num_prefix_cache_queries_total, stats.num_prefix_cache_hits_total)


def _percent(part: float, whole: float) -> float:
    return 100.0 * part / whole if whole else 0.0


class StatsLine:
    """The line of each interval, from the engine's latest stats and the last line's."""

    def __init__(self, start: EngineStats | None, now: float) -> None:
        self._last = _mark(start, now)
        self._idle_logged = False
        self._hit_rate = 0.0  # over the latest interval with prefix-cache look-ups

    def line(self, stats: EngineStats | None, now: float) -> str | None:
        """This interval's line; None where nothing has changed since an idle line."""
        if stats is None:
            return None  # no step yet
        mark, last = _mark(stats, now), self._last
        self._last = mark
        idle = (stats.num_running == 0 and stats.num_waiting == 0
                and mark.prompt_tokens == last.prompt_tokens
                and mark.generation_tokens == last.generation_tokens)
        if idle and self._idle_logged:
            return None
        self._idle_logged = idle
        dt = max(mark.time_s - last.time_s, 1e-9)
        parts = [
            f"Avg prompt throughput: {(mark.prompt_tokens - last.prompt_tokens) / dt:.1f} tokens/s",
            f"Avg generation throughput: "
            f"{(mark.generation_tokens - last.generation_tokens) / dt:.1f} tokens/s",
            f"Running: {stats.num_running} reqs", f"Waiting: {stats.num_waiting} reqs",
            f"GPU KV cache usage: {_percent(stats.gpu_blocks_used, stats.gpu_blocks_total):.1f}%",
        ]
        if mark.queries > last.queries:  # else the last rate stands (no look-up since)
            self._hit_rate = _percent(mark.hits - last.hits, mark.queries - last.queries)
        parts.append(f"Prefix cache hit rate: {self._hit_rate:.1f}%")
        # kvtier's own fields after vLLM's, so parsers of vLLM's line read this one
        if stats.host_blocks_total:
            parts.append(f"Host KV cache usage: "
                         f"{_percent(stats.host_blocks_used, stats.host_blocks_total):.1f}%")
        if stats.num_swapped:
            parts.append(f"Swapped: {stats.num_swapped} reqs")
        return ", ".join(parts)


async def log_stats_every(interval_s: float, read: Callable[[], EngineStats | None]) -> None:
    """Logs a line every `interval_s` until cancelled (the app's lifespan runs it)."""
    lines = StatsLine(read(), time.monotonic())
    while True:
        await asyncio.sleep(interval_s)
        text = lines.line(read(), time.monotonic())
        if text is not None:
            logger.info("%s", text)
