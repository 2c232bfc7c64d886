"""Server-sent events, and noticing a client that has gone away.

A client that disconnects must free its KV blocks at once, also while its request is still
waiting and nothing is being sent (a failed write alone would notice only at the next
token). So both response paths watch the ASGI `receive` channel for `http.disconnect`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import anyio
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from kvtier.server.errors import FAILURE_STATUS, error_body

T = TypeVar("T")

DONE = "data: [DONE]\n\n"


def sse(model: BaseModel) -> str:
    return f"data: {model.model_dump_json()}\n\n"


def sse_error(status: int, message: str) -> str:
    return sse(error_body(status, message))


# What can end a stream after its 200 went out: an error event, then [DONE].
STREAM_FAILURES = tuple(FAILURE_STATUS)


def failure_event(exc: BaseException) -> str:
    return sse_error(FAILURE_STATUS[type(exc)], str(exc))


class ClientDisconnected(Exception):
    pass


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def until_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await `work`; cancel it and raise ClientDisconnected if the client leaves first."""
    work_task = asyncio.ensure_future(work)
    watch_task = asyncio.ensure_future(_wait_disconnect(request.receive))
    try:
        done, _ = await asyncio.wait({work_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch_task.cancel()
        if not work_task.done():
            work_task.cancel()
    if work_task in done:
        return work_task.result()
    raise ClientDisconnected()


class EventStreamResponse(Response):
    """Streams `events` as text/event-stream; `on_close()` runs however the stream ends."""

    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], on_close: Callable[[], None]) -> None:
        self.events = events
        self.on_close = on_close
        self.status_code = 200
        self.background = None
        self.init_headers({"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    await self._stream(send)
                    tg.cancel_scope.cancel()

                async def watch() -> None:
                    await _wait_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                tg.start_soon(watch)
        finally:
            self.on_close()  # aborts unfinished engine requests: frees their blocks now
            await self.events.aclose()  # type: ignore[attr-defined]

    async def _stream(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
        async for event in self.events:
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
