"""POST /reset_prefix_cache (vLLM's admin endpoint; SGLang's /flush_cache): drop every cached
KV block.

It runs on the engine's worker between two steps (`AsyncEngine.call`), never beside a step.
While a request holds KV blocks the engine refuses, changing nothing (a running request
keeps caching its blocks as they fill, so a partial reset would keep KV computed before
it: kvtier/kv/prefix_cache.py), and the endpoint answers 409 with the count; vLLM's server
answers 200 either way and only logs the refusal.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel

from kvtier.server.async_engine import AsyncEngine, EngineDeadError, ShuttingDownError
from kvtier.server.errors import error_response

RESET_PREFIX_CACHE_PATH = "/reset_prefix_cache"
FLUSH_CACHE_PATH = "/flush_cache"  # SGLang's name (GET or POST), the same answer


class ResetPrefixCacheResponse(BaseModel):
    reset: bool


def _reset(engine: Any) -> tuple[bool, int]:
    """(reset, sequences holding KV blocks), read in the same call: the count is the one
    that refused it."""
    reset, stats = engine.reset_prefix_cache(), engine.get_stats()
    return reset, stats.num_running + stats.num_swapped


async def reset_prefix_cache_response(async_engine: AsyncEngine) -> JSONResponse:
    try:
        reset, num_seqs = await async_engine.call(_reset)
    except (EngineDeadError, ShuttingDownError) as exc:
        return error_response(503, str(exc), code="unavailable")
    if not reset:
        return error_response(
            409, f"the prefix cache was not reset: {num_seqs} running or swapped-out sequences "
            "hold KV blocks; retry when they have finished", code="prefix_cache_busy")
    return JSONResponse(ResetPrefixCacheResponse(reset=True).model_dump())
