"""SGLang's endpoints beside its native /generate, for the tools written against SGLang:

  * GET /get_model_info (/model_info): the model's path, tokenizer and architecture;
  * GET /get_server_info (/server_info): the serving limits under SGLang's argument names,
    the KV pool's token capacity, and `internal_states` (sglang.bench_serving reads its
    first entry after a run, for speculative decoding's accept length: absent here, so the
    client reports none);
  * GET /health_generate: healthy only if the engine still generates. A one-token probe
    must finish within HEALTH_GENERATE_TIMEOUT_S; while the waiting queue is full (the probe
    cannot queue) any step the engine finishes in that time proves it, so a busy server is
    not taken for a hung one.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.responses import JSONResponse, Response

from kvtier.sampling_params import SamplingParams
from kvtier.server.async_engine import ServerOverloadedError
from kvtier.server.errors import error_response
from kvtier.server.state import ServerState
from kvtier.server.streams import EngineDeadError, RequestFailedError, ShuttingDownError
from kvtier.server.tokenize_api import version

SGLANG_INFO_PATHS = ("/get_model_info", "/model_info", "/get_server_info", "/server_info")
HEALTH_GENERATE_TIMEOUT_S = 20.0  # SGLang's default for the same probe
_STEP_POLL_S = 0.05
_PROBE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, detokenize=False)


def model_info(state: ServerState) -> dict[str, Any]:
    config = state.engine.config
    arch = config.model_config.architecture
    return {
        "model_path": config.model,
        "tokenizer_path": config.tokenizer or config.model,
        "served_model_name": state.served_model_names[0],
        "is_generation": True,
        "model_type": arch.removesuffix("ForCausalLM").lower(),
        "architectures": [arch],
        "has_image_understanding": False,
        "has_audio_understanding": False,
    }


def server_info(state: ServerState) -> dict[str, Any]:
    """SGLang's names for what kvtier's flags set (the rest of its arguments have no
    counterpart here), with the live pool and queue."""
    config, limits = state.engine.config, state.limits
    sched, cache = config.scheduler, config.cache
    stats = state.async_engine.stats
    capacity = stats.gpu_blocks_total * cache.block_size if stats is not None else None
    return {
        **model_info(state),
        "context_length": limits.max_model_len,
        "max_running_requests": sched.max_num_seqs,
        "max_prefill_tokens": sched.max_num_batched_tokens,
        "chunked_prefill_size": sched.max_num_batched_tokens if sched.enable_chunked_prefill else -1,
        "page_size": cache.block_size,
        "disable_radix_cache": not cache.enable_prefix_caching,
        "schedule_policy": sched.schedule_policy,
        "random_seed": config.seed,
        "dtype": config.dtype,
        "device": config.device,
        "kv_policy": config.kv_policy,
        "max_total_num_tokens": capacity,
        "version": version()["version"],
        "internal_states": [_internal_state(state, capacity)],
    }


def _internal_state(state: ServerState, capacity: int | None) -> dict[str, Any]:
    stats = state.async_engine.stats
    if stats is None:  # no step yet
        return {"num_running_reqs": 0, "num_waiting_reqs": 0, "token_usage": 0.0,
                "token_capacity": capacity}
    used = stats.gpu_blocks_used / stats.gpu_blocks_total if stats.gpu_blocks_total else 0.0
    return {"num_running_reqs": stats.num_running, "num_waiting_reqs": stats.num_waiting,
            "token_usage": round(used, 4), "token_capacity": capacity}


async def health_generate(state: ServerState,
                          timeout_s: float = HEALTH_GENERATE_TIMEOUT_S) -> Response:
    engine = state.async_engine
    if not engine.is_healthy:
        return error_response(503, "the engine is not running", code="unavailable")
    token = state.engine.config.model_config.bos_token_id or 0
    try:
        stream = await engine.submit([(state.new_request_id("health"), [token])], _PROBE,
                                     engine.now())
    except ServerOverloadedError:
        alive = await _steps_within(state, timeout_s)
    except (ShuttingDownError, EngineDeadError) as exc:
        return error_response(503, str(exc), code="unavailable")
    else:
        alive = await _finishes_within(stream, timeout_s)
    if alive:  # SGLang answers an empty 200; a JSON body keeps the API's one content type
        return JSONResponse({"status": "ok"})
    return error_response(503, f"the engine generated nothing within {timeout_s:g} s",
                          code="unavailable")


async def _finishes_within(stream: Any, timeout_s: float) -> bool:
    async def drain() -> None:
        async for _ in stream:
            pass

    try:
        await asyncio.wait_for(drain(), timeout_s)
        return True
    except (asyncio.TimeoutError, EngineDeadError, ShuttingDownError, RequestFailedError):
        return False
    finally:
        stream.close()


async def _steps_within(state: ServerState, timeout_s: float) -> bool:
    """Whether the engine publishes a new step's stats within `timeout_s`."""
    engine = state.async_engine
    seen, deadline = engine.stats, time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        await asyncio.sleep(_STEP_POLL_S)
        if engine.stats is not seen:
            return True
        if not engine.is_healthy:
            return False
    return False
