"""The two ways an endpoint answers a submitted request, shared by chat and completions."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from kvtier.server.async_engine import RequestStream
from kvtier.server.results import Collected, collect
from kvtier.server.state import ServerState
from kvtier.server.streaming import ClientDisconnected, EventStreamResponse, until_disconnected


async def respond(
    state: ServerState, raw: Request, stream: RequestStream, streaming: bool, n: int,
    events: Callable[[], AsyncIterator[str]], build: Callable[[Collected], Any],
) -> Any:
    """An event stream of `events()`, or `build(collected)` once all `n` choices finished.
    Either way a client that goes away aborts the request at once (its KV blocks freed)."""

    def close() -> None:
        state.metrics.requests_aborted.inc(stream.close())

    if streaming:
        return EventStreamResponse(events(), on_close=close)
    try:
        results = await until_disconnected(raw, collect(stream, n))
    except ClientDisconnected:
        return Response(status_code=499)  # nobody reads it
    finally:
        close()  # a no-op once everything finished
    return build(results)
