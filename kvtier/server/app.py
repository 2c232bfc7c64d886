"""The FastAPI application: routes, error handlers, middleware, engine lifecycle."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST

from kvtier.server.api_models import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    ModelCard,
    ModelList,
)
from kvtier.server.async_engine import AsyncEngine
from kvtier.server.errors import error_response, install_error_handlers
from kvtier.server.metrics import ServerMetrics
from kvtier.server.middleware import APIKeyMiddleware, BodyLimitMiddleware
from kvtier.server.params import ServingLimits
from kvtier.server.serving_chat import create_chat_completion
from kvtier.server.serving_completions import create_completion
from kvtier.server.state import ServerState

DEFAULT_MAX_WAITING_REQUESTS = 256
DEFAULT_MAX_REQUEST_BODY_BYTES = 8 * 2**20

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse, "description": text}
    for code, text in [
        (400, "Invalid request (bad JSON, missing or invalid fields, prompt too long)."),
        (401, "Missing or wrong API key."),
        (404, "Unknown model."),
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
    max_waiting_requests: int | None = None,
    max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES,
    shutdown_timeout_s: float = 30.0,
) -> FastAPI:
    """An OpenAI-compatible app serving `engine` (an LLMEngine, see docs/ENGINE_API.md).

    The engine's step loop starts with the app (lifespan) and stops with it: on shutdown
    new requests get 503, in-flight ones have `shutdown_timeout_s` to finish, then abort.
    `app.state.server.async_engine.call(fn)` runs `fn(engine)` safely between steps.
    `max_waiting_requests` defaults to the engine's `--max-waiting-requests`, else 256.
    """
    sched = engine.config.scheduler
    if max_waiting_requests is None:
        max_waiting_requests = getattr(sched, "max_waiting_requests", None) or DEFAULT_MAX_WAITING_REQUESTS
    metrics = ServerMetrics()
    async_engine = AsyncEngine(engine, max_waiting_requests=max_waiting_requests, on_update=metrics.observe)
    metrics.attach(async_engine)
    state = ServerState(
        engine=engine,
        async_engine=async_engine,
        served_model_names=tuple(served_model_names or (engine.served_model_name,)),
        limits=ServingLimits(
            max_model_len=sched.max_model_len,
            vocab_size=engine.model_config.vocab_size,
            max_num_seqs=sched.max_num_seqs,
            max_prompts=max_waiting_requests,
        ),
        metrics=metrics,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        async_engine.start()
        yield
        await async_engine.shutdown(shutdown_timeout_s)
        state.tokenize_pool.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="kvtier", summary="OpenAI-compatible LLM server", lifespan=lifespan)
    app.state.server = state
    install_error_handlers(app)
    _add_routes(app, state)
    app.add_middleware(BodyLimitMiddleware, max_bytes=max_request_body_bytes)
    if api_key:
        app.add_middleware(APIKeyMiddleware, api_key=api_key)  # outermost: checked first
    return app


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions", response_model=CompletionResponse, responses={**_ERRORS, 200: _STREAM_DOC})
    async def completions(req: CompletionRequest, raw: Request) -> Any:
        return await create_completion(state, req, raw)

    @app.post(
        "/v1/chat/completions", response_model=ChatCompletionResponse, responses={**_ERRORS, 200: _STREAM_DOC}
    )
    async def chat_completions(req: ChatCompletionRequest, raw: Request) -> Any:
        return await create_chat_completion(state, req, raw)

    @app.get("/v1/models", response_model=ModelList, responses={401: _ERRORS[401]})
    async def models() -> ModelList:
        max_len = state.limits.max_model_len
        root = state.served_model_names[0]
        return ModelList(data=[ModelCard(id=n, root=root, max_model_len=max_len) for n in state.served_model_names])

    @app.get("/health", responses={503: _ERRORS[503]})
    async def health() -> Response:
        if state.async_engine.is_healthy:
            return JSONResponse({"status": "ok"})
        return error_response(503, "the engine is not running", code="unavailable")

    @app.get("/metrics", response_class=Response, responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
    async def prometheus_metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)
