"""The asyncio side of one API call: its engine requests' updates, and how they can fail."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Protocol

from kvtier.server.updates import RequestUpdate


class ServerOverloadedError(RuntimeError):
    """The waiting queue is full; the client should retry later (HTTP 503)."""


class ShuttingDownError(RuntimeError):
    """The server no longer accepts requests, or ended this one on shutdown (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine's step loop failed for good; nothing more can be served (HTTP 503)."""


class RequestFailedError(RuntimeError):
    """An engine step computing this request raised; the request is ended (HTTP 500)."""


class RequestTimeoutError(RuntimeError):
    """The request outlived the server's --request-timeout; it is ended (HTTP 408)."""


class _Aborter(Protocol):
    def abort(self, request_ids: Iterable[str]) -> int: ...


class RequestStream:
    """The updates of the engine requests of one API call (one per prompt), on the loop."""

    def __init__(self, request_ids: Sequence[str], owner: _Aborter) -> None:
        self.request_ids = tuple(request_ids)
        self._unfinished = set(request_ids)  # until their last update is read
        self._ended: set[str] = set()  # whose last update the engine has queued
        self._queue: asyncio.Queue[RequestUpdate | None] = asyncio.Queue()
        self._failure: BaseException | None = None
        self._owner = owner
        self.deadline: asyncio.TimerHandle | None = None  # --request-timeout's, if any

    @property
    def finished(self) -> bool:
        return not self._unfinished

    @property
    def engine_finished(self) -> bool:
        """The engine is done with every request (their last updates may be unread)."""
        return len(self._ended) == len(self.request_ids)

    def put(self, update: RequestUpdate) -> None:
        if update.finished:
            self._ended.add(update.request_id)
        self._queue.put_nowait(update)

    def fail(self, exc: BaseException) -> None:
        """End the stream with `exc` (engine died, shutdown), raised to its consumer."""
        if not self._unfinished and self._queue.empty():
            return  # everything was delivered: nothing left to end
        if self._failure is None:  # the first reason is the one the client gets
            self._failure = exc
        self._queue.put_nowait(None)  # wakes a consumer waiting in __aiter__

    async def __aiter__(self) -> AsyncIterator[RequestUpdate]:
        while True:
            # Checked before `_unfinished`: a failed stream must never look complete.
            if self._failure is not None:
                raise self._failure
            if not self._unfinished:
                return
            update = await self._queue.get()
            if update is None:
                continue
            if update.finished:
                self._unfinished.discard(update.request_id)
            yield update

    def close(self) -> int:
        """Abort whatever is unfinished (client gone, error); return how many. Idempotent."""
        if self.deadline is not None:
            self.deadline.cancel()
        if not self._unfinished:
            return 0
        num = self._owner.abort(self._unfinished)
        self._unfinished.clear()
        return num
