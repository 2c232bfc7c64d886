"""The FastAPI application: routes, error handlers, middleware, engine lifecycle."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kvtier.server.api_models import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    DetokenizeRequest,
    DetokenizeResponse,
    ErrorResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from kvtier.server.async_engine import AsyncEngine
from kvtier.server.errors import error_response, install_error_handlers
from kvtier.server.http_options import CorsOptions
from kvtier.server.logs import ServerLogs
from kvtier.server.metrics import ServerMetrics
from kvtier.server.middleware import (
    AdmissionMiddleware,
    APIKeyMiddleware,
    BodyLimitMiddleware,
    RequestIdMiddleware,
)
from kvtier.server.model_cards import ModelCard, ModelList
from kvtier.server.openapi import openapi_without_422
from kvtier.server.params import ServingLimits, max_token_chars
from kvtier.server.reasoning import REASONING_PARSERS, ReasoningParser
from kvtier.server.reset import (
    FLUSH_CACHE_PATH,
    RESET_PREFIX_CACHE_PATH,
    ResetPrefixCacheResponse,
    reset_prefix_cache_response,
)
from kvtier.server.responses_api import create_response
from kvtier.server.responses_request import ResponsesRequest
from kvtier.server.serving_chat import create_chat_completion
from kvtier.server.serving_completions import create_completion
from kvtier.server.sglang_generate import GenerateRequest, create_generate
from kvtier.server.sglang_info import SGLANG_INFO_PATHS, health_generate, model_info, server_info
from kvtier.server.state import DEFAULT_MAX_TOKENIZE_QUEUE_CHARS, ServerState
from kvtier.server.stats_log import log_stats_every
from kvtier.server.tokenize_api import detokenize_response, tokenize_response, version
from kvtier.server.tool_parsers import make_parser

DEFAULT_MAX_WAITING_REQUESTS = 256
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in [
        (400, "Invalid request (bad JSON, missing or invalid fields, prompt too long)."),
        (401, "Missing or wrong API key."),
        (408, "The request outlived the server's --request-timeout."),
        (404, "Unknown model."),
        (409, "The prefix cache was not reset: requests hold KV blocks; retry when they finished."),
        (413, "Request body too large."),
        (503, "Waiting queue full, shutting down, or engine down; see Retry-After."),
    ]
}
_STREAM_DOC = {"content": {"text/event-stream": {}}, "description": "JSON, or SSE when stream"}


def build_app(
    engine: Any,
    *,
    served_model_names: Sequence[str] | None = None,
    api_key: str | None = None,
    metrics_need_key: bool = False,
    max_waiting_requests: int | None = None,
    max_seqs_per_request: int | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    max_tokenize_queue_chars: int = DEFAULT_MAX_TOKENIZE_QUEUE_CHARS,
    shutdown_timeout_s: float = 30.0,
    request_timeout_s: float | None = None,
    tool_call_parser: str | None = None,
    reasoning_parser: str | None = None,
    cors: CorsOptions | None = CorsOptions(),
    logs: ServerLogs = ServerLogs(),
    return_tokens_as_token_ids: bool = False,
    request_id_headers: bool = False,
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` (an LLMEngine, see docs/ENGINE_API.md).

    The engine's step loop starts with the app (lifespan) and stops with it: on shutdown
    new requests get 503, in-flight ones have `shutdown_timeout_s` to finish, then end with
    an error (`ServerState.drain`, which `connections.KVTierServer` calls on SIGTERM).
    `app.state.server.async_engine.call(fn)` runs `fn(engine)` safely between steps.
    `max_waiting_requests` (sequences) defaults to the engine's `--max-waiting-requests`,
    else 256; `max_seqs_per_request` (prompts x n of one call) to `max_waiting_requests`.
    `api_key` guards /v1/* and POST /reset_prefix_cache (and /metrics with `metrics_need_key`).
    `request_timeout_s`: a request unfinished that long after submission ends with 408.
    `tool_call_parser` (hermes, llama3_json) turns on tool_choice "auto"
    (`--enable-auto-tool-choice`; kvtier/server/tool_calls.py); `reasoning_parser` (qwen3,
    deepseek_r1) splits a chat reply's thinking into `reasoning_content`.
    `cors`: vLLM's default, any origin, no credentials (None: no CORS; http_options.py).
    `logs`: vLLM's stats line and request lines (logs.py; by default neither).
    `return_tokens_as_token_ids`: the request field's default (vLLM's flag).
    `request_id_headers`: X-Request-Id on every response (vLLM's --enable-request-id-headers).
    """
    _check_options(api_key, request_timeout_s)
    max_waiting_requests, max_seqs_per_request = _queue_limits(
        engine.config.scheduler, max_waiting_requests, max_seqs_per_request)
    metrics, async_engine = _step_loop(engine, max_waiting_requests)
    state = ServerState(
        engine=engine, async_engine=async_engine, metrics=metrics,
        served_model_names=tuple(served_model_names or (engine.served_model_name,)),
        limits=_serving_limits(engine, max_seqs_per_request),
        max_tokenize_queue_chars=max_tokenize_queue_chars,
        shutdown_timeout_s=shutdown_timeout_s, request_timeout_s=request_timeout_s,
        tool_parser=make_parser(tool_call_parser) if tool_call_parser else None,
        reasoning_parser=_reasoning_parser(reasoning_parser),
        logs=logs, return_tokens_as_token_ids=return_tokens_as_token_ids,
    )
    app = FastAPI(title="kvtier", summary="OpenAI-compatible LLM server",
                  lifespan=_lifespan(state, shutdown_timeout_s, logs.stats_interval_s))
    app.state.server = state
    install_error_handlers(app)
    _add_routes(app, state)
    app.openapi = openapi_without_422(app)  # type: ignore[method-assign]
    _add_middleware(app, state, max_request_body_bytes, api_key, metrics_need_key, cors,
                    request_id_headers)
    return app


def _step_loop(engine: Any, max_waiting_requests: int) -> tuple[ServerMetrics, AsyncEngine]:
    """The engine's step loop, and the metrics that observe its every update."""
    metrics = ServerMetrics()
    async_engine = AsyncEngine(engine, max_waiting_requests=max_waiting_requests, on_update=metrics.observe)
    metrics.attach(async_engine)
    return metrics, async_engine


def _check_options(api_key: str | None, request_timeout_s: float | None) -> None:
    if api_key is not None and not api_key.strip():
        raise ValueError("the API key is empty: pass a non-empty key, or none to serve without one")
    if request_timeout_s is not None and not request_timeout_s > 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")


def _reasoning_parser(name: str | None) -> ReasoningParser | None:
    if name is None:
        return None
    if name not in REASONING_PARSERS:
        raise ValueError(f"unknown reasoning parser {name!r}; known: {', '.join(REASONING_PARSERS)}")
    return REASONING_PARSERS[name]


def _serving_limits(engine: Any, max_seqs_per_request: int) -> ServingLimits:
    sched, vocab_size = engine.config.scheduler, engine.model_config.vocab_size
    return ServingLimits(
        max_model_len=sched.max_model_len,
        vocab_size=vocab_size,
        max_num_seqs=sched.max_num_seqs,
        max_seqs_per_request=max_seqs_per_request,
        max_token_chars=max_token_chars(engine.tokenizer, min(vocab_size, engine.tokenizer.vocab_size)),
        max_logprobs=engine.config.logprobs_limit,
        priority_scheduling=sched.schedule_policy == "priority",
    )


def _lifespan(state: ServerState, shutdown_timeout_s: float, log_stats_interval_s: float | None):
    """The app's lifespan: the engine's step loop (and the stats line's task) runs while the
    app serves."""

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.async_engine.start()
        stats_task = None
        if log_stats_interval_s is not None:
            stats_task = asyncio.create_task(
                log_stats_every(log_stats_interval_s, lambda: state.async_engine.stats))
        yield
        if stats_task is not None:
            stats_task.cancel()
        await state.async_engine.shutdown(shutdown_timeout_s)
        state.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    return lifespan


def _queue_limits(sched: Any, max_waiting_requests: int | None,
                  max_seqs_per_request: int | None) -> tuple[int, int]:
    """(max_waiting_requests, max_seqs_per_request) with build_app's defaults, checked."""
    if max_waiting_requests is None:
        max_waiting_requests = getattr(sched, "max_waiting_requests", None) or DEFAULT_MAX_WAITING_REQUESTS
    if max_seqs_per_request is None:
        max_seqs_per_request = max_waiting_requests
    if not 1 <= max_seqs_per_request <= max_waiting_requests:
        raise ValueError(f"max_seqs_per_request must be in [1, max_waiting_requests={max_waiting_requests}]"
                         f" (a larger request could never be admitted), got {max_seqs_per_request}")
    return max_waiting_requests, max_seqs_per_request


def _add_middleware(app: FastAPI, state: ServerState, max_request_body_bytes: int,
                    api_key: str | None, metrics_need_key: bool, cors: CorsOptions | None,
                    request_id_headers: bool = False) -> None:
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_body_bytes)
    app.add_middleware(AdmissionMiddleware, refusal=state.refusal)  # before the body is read
    if api_key:
        protected = ("/v1", "/generate", "/tokenize", "/detokenize", RESET_PREFIX_CACHE_PATH,
                     FLUSH_CACHE_PATH) + SGLANG_INFO_PATHS + (
            ("/metrics",) if metrics_need_key else ())
        app.add_middleware(APIKeyMiddleware, api_key=api_key, protected=protected)
    if cors is not None:  # outside the key: preflights carry none, and a 401 must be readable
        app.add_middleware(CORSMiddleware, **cors.middleware_kwargs())
    if request_id_headers:  # outermost: a 401, 413 or 503 carries it too
        app.add_middleware(RequestIdMiddleware)


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions", response_model=CompletionResponse, responses={**_ERRORS, 200: _STREAM_DOC})
    async def completions(req: CompletionRequest, raw: Request) -> Any:
        return await create_completion(state, req, raw)

    @app.post(
        "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**_ERRORS, 200: _STREAM_DOC}
    )
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Any:
        return await create_chat_completion(state, req, raw)

    def card(name: str) -> ModelCard:  # root: the model loaded, as vLLM names it
        return ModelCard(id=name, root=str(state.engine.config.model),
                         max_model_len=state.limits.max_model_len)

    @app.get("/v1/models", response_model=ModelList, responses={401: _ERRORS[401]})
    async def models() -> ModelList:
        return ModelList(data=[card(n) for n in state.served_model_names])

    # OpenAI's "retrieve model" (the official client's models.retrieve); `:path` since
    # served names may hold slashes ("meta-llama/Llama-3.1-8B").
    @app.get("/v1/models/{model:path}", response_model=ModelCard,
             responses={401: _ERRORS[401], 404: _ERRORS[404]})
    async def model(model: str) -> ModelCard:
        return card(state.resolve_model(model))

    @app.get("/health", responses={503: _ERRORS[503]})
    @app.head("/health", include_in_schema=False)
    async def health() -> Response:
        return _health(state)

    @app.post(RESET_PREFIX_CACHE_PATH, response_model=ResetPrefixCacheResponse,
              responses={401: _ERRORS[401], 409: _ERRORS[409], 503: _ERRORS[503]})
    @app.api_route(FLUSH_CACHE_PATH, methods=["GET", "POST"], include_in_schema=False)
    async def reset_prefix_cache() -> Any:  # /flush_cache: SGLang's name for it
        return await reset_prefix_cache_response(state.async_engine)

    # HEAD too (unlisted): load generators probe /metrics and /health with it.
    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    @app.head("/metrics", include_in_schema=False)
    async def prometheus_metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    _add_utility_routes(app, state)


def _health(state: ServerState) -> Response:
    if state.async_engine.is_healthy:
        return JSONResponse({"status": "ok"})
    return error_response(503, "the engine is not running", code="unavailable")


def _add_utility_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's endpoints beside the OpenAI API (`tokenize_api.py`)."""

    @app.post("/tokenize", response_model=TokenizeResponse,
              responses={k: _ERRORS[k] for k in (400, 401, 404, 503)})
    async def tokenize(req: TokenizeRequest) -> TokenizeResponse:
        return await tokenize_response(state, req)

    @app.post("/detokenize", response_model=DetokenizeResponse,
              responses={k: _ERRORS[k] for k in (400, 401, 404, 503)})
    async def detokenize(req: DetokenizeRequest) -> DetokenizeResponse:
        return await detokenize_response(state, req)

    @app.get("/version")
    async def server_version() -> dict[str, Any]:
        return version()

    @app.get("/ping", responses={503: _ERRORS[503]})
    @app.post("/ping", include_in_schema=False)
    async def ping() -> Response:  # vLLM's (SageMaker's) liveness probe: /health's answer
        return _health(state)

    # OpenAI's Responses API (kvtier/server/responses_api.py)
    @app.post("/v1/responses", responses={**_ERRORS, 200: _STREAM_DOC})
    async def responses(req: ResponsesRequest, raw: Request) -> Any:
        return await create_response(state, req, raw)

    # SGLang's native endpoint (kvtier/server/sglang_generate.py)
    @app.post("/generate", responses={**_ERRORS, 200: _STREAM_DOC})
    async def generate(req: GenerateRequest, raw: Request) -> Any:
        return await create_generate(state, req, raw)

    _add_sglang_info_routes(app, state)


def _add_sglang_info_routes(app: FastAPI, state: ServerState) -> None:
    # Each under its old name too: SGLang's tools still ask for /get_model_info and
    # /get_server_info.
    @app.get("/get_model_info", responses={401: _ERRORS[401]})
    @app.get("/model_info", include_in_schema=False)
    async def get_model_info() -> dict[str, Any]:
        return model_info(state)

    @app.get("/get_server_info", responses={401: _ERRORS[401]})
    @app.get("/server_info", include_in_schema=False)
    async def get_server_info() -> dict[str, Any]:
        return server_info(state)

    @app.get("/health_generate", responses={503: _ERRORS[503]})
    async def health_generate_probe() -> Response:
        return await health_generate(state)
