"""What every handler needs: the engine, its limits, the served names, and admission."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from starlette.requests import Request

from kvtier.config import GenerationDefaults
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.server.api_models import _SamplingFields
from kvtier.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    RequestStream,
    RequestTimeoutError,
    ServerOverloadedError,
    ShuttingDownError,
)
from kvtier.server.errors import APIError
from kvtier.server.logs import ServerLogs
from kvtier.server.metrics import ServerMetrics
from kvtier.server.params import ServingLimits, check_before_tokenizing
from kvtier.server.reasoning import ReasoningParser
from kvtier.server.results import logprob_names
from kvtier.server.tool_parsers import ToolParser

RETRY_AFTER_S = 1
# Characters waiting for (or in) the tokenizer thread at most; beyond, 503 at once rather
# than a queue that holds every later request for seconds.
DEFAULT_MAX_TOKENIZE_QUEUE_CHARS = 16 * 2**20
T = TypeVar("T")


@dataclass
class Seats:
    """Waiting places a request holds between admission and submission."""

    num: int


@dataclass
class ServerState:
    engine: Any  # LLMEngine (duck-typed: the contract is docs/ENGINE_API.md)
    async_engine: AsyncEngine
    served_model_names: tuple[str, ...]
    limits: ServingLimits
    metrics: ServerMetrics
    # Tokenizing a multi-megabyte prompt takes seconds: off the event loop, so the other
    # streams keep flowing; one thread, so tokenizer calls never overlap each other.
    tokenize_pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvtier-tokenize")
    )
    max_tokenize_queue_chars: int = DEFAULT_MAX_TOKENIZE_QUEUE_CHARS
    shutdown_timeout_s: float = 30.0
    request_timeout_s: float | None = None  # from submission; None: no server-side deadline
    # --enable-auto-tool-choice's --tool-call-parser (kvtier/server/tool_parsers.py), or None
    tool_parser: ToolParser | None = None
    reasoning_parser: ReasoningParser | None = None  # --reasoning-parser (kvtier/server/reasoning.py)
    logs: ServerLogs = ServerLogs()  # --enable-log-requests and the stats line (logs.py)
    # --return-tokens-as-token-ids: the default of the request field of that name.
    return_tokens_as_token_ids: bool = False
    # Sequences of requests admitted but not submitted yet (tokenizing): they count
    # against the waiting bound, so a burst is refused before it queues at the tokenizer.
    _reserved_seqs: int = 0
    _queued_chars: int = 0

    async def drain(self) -> None:
        """SIGTERM: refuse new requests (503), give running ones `shutdown_timeout_s`, then
        end each with an error response; the engine's worker keeps running until lifespan."""
        await self.async_engine.drain(self.shutdown_timeout_s)

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def logprob_names(self, req: Any) -> Any:
        """What names the tokens of a request's logprobs (results.logprob_names)."""
        return logprob_names(self.tokenizer, req.return_tokens_as_token_ids,
                             self.return_tokens_as_token_ids)

    @property
    def generation_defaults(self) -> GenerationDefaults:
        """The model's default sampling, for the fields a request leaves unset."""
        return self.engine.config.generation_defaults

    @asynccontextmanager
    async def admitted(self, req: _SamplingFields) -> AsyncIterator[Seats]:
        """Refuse what can be refused before any tokenizing (400 too big, 503 queue full or
        shutting down), then hold the request's sequences' places until it is submitted
        (`submit(..., seats)` hands them to the engine's count) or fails."""
        num_seqs = check_before_tokenizing(req, self.limits)
        try:
            self.async_engine.check_admission(num_seqs, self._reserved_seqs)
        except Exception as exc:
            raise self._unavailable(exc) from None
        self._reserved_seqs += num_seqs
        seats = Seats(num_seqs)
        try:
            yield seats
        finally:
            self._release(seats)

    def _release(self, seats: Seats) -> None:
        self._reserved_seqs -= seats.num
        seats.num = 0

    def refusal(self) -> APIError | None:
        """The 503 a new request would get now (not even one sequence could wait), if any."""
        try:
            self.async_engine.check_admission(1, self._reserved_seqs)
        except Exception as exc:
            error = self._unavailable(exc)
            return error if isinstance(error, APIError) else None
        return None

    async def tokenize(self, num_chars: int, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (a function of params.py that tokenizes `num_chars` characters)
        on the tokenizer thread; 503 at once while too much text waits for it."""
        if self._queued_chars and self._queued_chars + num_chars > self.max_tokenize_queue_chars:
            raise self._unavailable(ServerOverloadedError(
                f"the server is overloaded: {self._queued_chars} characters wait for the "
                "tokenizer; retry later"))
        self._queued_chars += num_chars
        try:
            return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)
        finally:
            self._queued_chars -= num_chars

    def resolve_model(self, name: str | None) -> str:
        """The name to answer with; 404 for a model this server does not serve. None or
        "" is the (first) served model, as vLLM takes them."""
        if not name:
            return self.served_model_names[0]
        if name not in self.served_model_names:
            raise APIError(
                404,
                f"The model `{name}` does not exist.",
                param="model",
                code="model_not_found",
            )
        return name

    @staticmethod
    def new_request_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex}"

    @staticmethod
    def response_id(prefix: str, request_id: str, raw: Request, given: str | None) -> str:
        """The `id` a response carries: vLLM's `{prefix}-{X-Request-Id}` when the client
        sends the header, else `{prefix}-{given}` (the body's `request_id`), else the
        engine's own id. Engine ids stay new_request_id's: two clients may send the same."""
        base = raw.headers.get("x-request-id") or given
        return f"{prefix}-{base}" if base else request_id

    async def compile_format(self, params: SamplingParams) -> None:
        """A structured request's grammar compiled on the tokenizer thread (a large schema
        may take a while: not on the engine's), where the engine's own compile finds it;
        a schema, pattern or grammar xgrammar refuses is a 400."""
        spec = params.structured_outputs
        if spec is None:
            return
        size = sum(len(v) for v in (spec.json, spec.regex, spec.grammar) if v)
        try:
            await self.tokenize(size + sum(map(len, spec.choice or ())),
                                self.engine.grammars.compile, params)
        except InvalidRequestError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None

    async def submit(
        self, request_id: str, prompts: Sequence[list[int]], params: SamplingParams, arrival_time: float,
        seats: Seats, priority: int = 0,
    ) -> RequestStream:
        """One engine request per prompt; engine and admission errors become API errors."""
        engine_prompts = [(f"{request_id}-{i}", p) for i, p in enumerate(prompts)]
        self.logs.request(request_id, prompts, params)
        self._release(seats)  # from here on the engine counts them as pending
        try:
            stream = await self.async_engine.submit(engine_prompts, params, arrival_time, priority)
        except InvalidRequestError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        except (ServerOverloadedError, ShuttingDownError, EngineDeadError) as exc:
            raise self._unavailable(exc) from None
        if self.request_timeout_s is not None:
            stream.deadline = asyncio.get_running_loop().call_later(
                self.request_timeout_s, _expire, stream, self.request_timeout_s)
        return stream

    def _unavailable(self, exc: BaseException) -> BaseException:
        """The 503 for an admission error (any other exception is returned as it is)."""
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        if isinstance(exc, ServerOverloadedError):
            self.metrics.requests_rejected.inc()
            return APIError(503, str(exc), code="server_overloaded", headers=retry)
        if isinstance(exc, (ShuttingDownError, EngineDeadError)):
            return APIError(503, str(exc), code="unavailable", headers=retry)
        return exc

    def prompt_index(self, stream: RequestStream) -> dict[str, int]:
        return {rid: i for i, rid in enumerate(stream.request_ids)}


def _expire(stream: RequestStream, timeout_s: float) -> None:
    """--request-timeout: end the stream with 408 and abort its engine requests now, not
    when its consumer next reads (a slow client may keep it waiting); the server ended them,
    so they are no client aborts in the metrics. A call the engine finished in time keeps
    its results, however slowly they are read."""
    if stream.engine_finished:
        return
    stream.fail(RequestTimeoutError(f"the request did not finish within the server's request "
                                    f"timeout of {timeout_s:g} s"))
    stream.close()
