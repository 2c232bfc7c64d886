"""What every handler needs: the engine, its limits, the served names, and admission."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.server.async_engine import (
    AsyncEngine,
    EngineDeadError,
    RequestStream,
    ServerOverloadedError,
    ShuttingDownError,
)
from kvtier.server.errors import APIError
from kvtier.server.metrics import ServerMetrics
from kvtier.server.params import ServingLimits

RETRY_AFTER_S = 1
T = TypeVar("T")


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

    @property
    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    async def tokenize(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn(*args)` (a function of params.py that tokenizes) on the tokenizer thread."""
        return await asyncio.get_running_loop().run_in_executor(self.tokenize_pool, fn, *args)

    def resolve_model(self, name: str | None) -> str:
        """The name to answer with; 404 for a model this server does not serve."""
        if name is None:
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

    async def submit(
        self, request_id: str, prompts: Sequence[list[int]], params: SamplingParams, arrival_time: float
    ) -> RequestStream:
        """One engine request per prompt; engine and admission errors become API errors."""
        engine_prompts = [(f"{request_id}-{i}", p) for i, p in enumerate(prompts)]
        try:
            return await self.async_engine.submit(engine_prompts, params, arrival_time)
        except InvalidRequestError as exc:
            raise APIError(400, str(exc), code="invalid_value") from None
        except ServerOverloadedError as exc:
            self.metrics.requests_rejected.inc()
            raise APIError(
                503, str(exc), code="server_overloaded", headers={"Retry-After": str(RETRY_AFTER_S)}
            ) from None
        except (ShuttingDownError, EngineDeadError) as exc:
            raise APIError(
                503, str(exc), code="unavailable", headers={"Retry-After": str(RETRY_AFTER_S)}
            ) from None

    def prompt_index(self, stream: RequestStream) -> dict[str, int]:
        return {rid: i for i, rid in enumerate(stream.request_ids)}
