"""Connections: slow or too many clients must not take the server down.

uvicorn reads a request's headers and body for as long as the client likes, and accepts
connections until the process runs out of file descriptors. `GuardedH11Protocol` bounds
both: headers must arrive within `header_timeout_s` of their first byte (else 408 and
close), a body may pause at most `body_timeout_s` between chunks (else close: the app sees
a disconnect), and past `max_connections` open connections a new one is answered 503.
`KVTierServer` drains the app on shutdown (ServerState.drain) before uvicorn's own
graceful timeout, and logs accept() failures once per `_ACCEPT_LOG_INTERVAL_S`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import resource
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from kvtier.server.errors import error_body, error_response
from kvtier.server.http_options import TLSOptions

logger = logging.getLogger(__name__)

# Time the app gets, after its own drain timeout, to send the error responses it ends
# requests with, before uvicorn cancels what is left.
_DRAIN_GRACE_S = 5.0
_ACCEPT_LOG_INTERVAL_S = 10.0
_FD_RESERVE = 256  # descriptors kept for the engine, logs and the tokenizer's files


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int = 2048
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    keep_alive_timeout_s: float = 5.0
    max_header_bytes: int = 64 * 2**10  # h11's bound on an incomplete request head
    backlog: int = 2048

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.backlog < 1 or self.max_header_bytes < 1:
            raise ValueError("max_connections, backlog and max_header_bytes must be >= 1")
        if min(self.header_timeout_s, self.body_timeout_s, self.keep_alive_timeout_s) <= 0:
            raise ValueError("connection timeouts must be > 0")


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one; return the connections it leaves room for."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 65536)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(1, soft - _FD_RESERVE)


async def _too_many_connections(scope: Any, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    response = error_response(503, "the server has too many open connections; retry later",
                              code="server_overloaded", headers={"Retry-After": "1", "Connection": "close"})
    await response(scope, receive, send)


def _timeout_response() -> bytes:
    body = error_body(408, "the request's headers did not arrive in time",
                      code="request_timeout").model_dump_json().encode()
    head = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n" % len(body))
    return head + body


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with header/body read timeouts and a connection bound."""

    limits = ConnectionLimits()  # set per server by `guarded_protocol`

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._deadline: asyncio.TimerHandle | None = None
        num_open = len(self.connections)
        if num_open > 2 * self.limits.max_connections:
            transport.abort()  # far over: not even a response, the descriptor is what counts
            return
        header_timeout = self.limits.header_timeout_s
        if num_open > self.limits.max_connections:
            self.app = _too_many_connections  # answered 503 once its headers are read
            header_timeout = min(header_timeout, 1.0)
        self._arm(header_timeout)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        state = self.conn.their_state
        if state is h11.IDLE:  # part of a request head: its deadline runs from its first byte
            if self._deadline is None:
                self._arm(self.limits.header_timeout_s)
        elif state is h11.SEND_BODY:  # each chunk gives the next one body_timeout_s
            self._arm(self.limits.body_timeout_s)
        else:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()  # arms uvicorn's keep-alive timeout
        self._disarm()

    def _arm(self, timeout_s: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(timeout_s, self._on_deadline)

    def _disarm(self) -> None:
        if getattr(self, "_deadline", None) is not None:
            self._deadline.cancel()  # type: ignore[union-attr]
            self._deadline = None

    def _on_deadline(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self.flow.read_paused:  # we stopped reading, not the client
                self._arm(self.limits.body_timeout_s)
                return
            self.transport.close()  # the app sees http.disconnect
        elif state is h11.IDLE and (self.cycle is None or self.cycle.response_complete):
            self.transport.write(_timeout_response())
            self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class KVTierServer(uvicorn.Server):
    """uvicorn's server, whose shutdown first drains the app (`drain()`: refuse new
    requests, let running ones finish, then end them with an error response)."""

    def __init__(self, config: uvicorn.Config, drain: Callable[[], Awaitable[None]] | None = None) -> None:
        super().__init__(config)
        self._drain = drain

    async def startup(self, sockets: Any = None) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(_AcceptErrorLog(loop.get_exception_handler()))
        await super().startup(sockets)

    async def shutdown(self, sockets: Any = None) -> None:
        drained = asyncio.ensure_future(self._drain()) if self._drain is not None else None
        await super().shutdown(sockets)
        if drained is not None and not drained.done():
            drained.cancel()


def server_config(app: Any, *, host: str, port: int, limits: ConnectionLimits, shutdown_timeout_s: float,
                  log_level: str = "info", tls: TLSOptions | None = None, root_path: str = "",
                  access_log: bool = True) -> uvicorn.Config:
    """The uvicorn config `kvtier serve` runs with (tests start theirs from it too);
    `root_path`: a reverse proxy's prefix (kvtier/server/http_options.py)."""
    return uvicorn.Config(
        app, host=host, port=port, log_level=log_level, access_log=access_log, root_path=root_path,
        **(tls.uvicorn_kwargs() if tls else {}),
        http=guarded_protocol(limits),
        timeout_keep_alive=int(max(1, round(limits.keep_alive_timeout_s))),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        backlog=limits.backlog,
        # Past the app's drain (shutdown_timeout_s) requests end with an error response;
        # uvicorn's cancellation is only for what still hangs after that.
        timeout_graceful_shutdown=shutdown_timeout_s + _DRAIN_GRACE_S,  # type: ignore[arg-type]
    )


class _AcceptErrorLog:
    """The event loop's exception handler, with accept() failures (out of descriptors) logged
    once per interval with a count, not once per attempt with a traceback."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._last = -float("inf")
        self._suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        is_accept = "accept" in str(context.get("message", ""))
        if not (is_accept or (isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE))):
            if self._inner is not None:
                self._inner(loop, context)
            else:
                loop.default_exception_handler(context)
            return
        now = time.monotonic()
        if now - self._last < _ACCEPT_LOG_INTERVAL_S:
            self._suppressed += 1
            return
        logger.error("cannot accept connections: %s (%d more such errors in the last %.0f s)",
                     exc or context.get("message"), self._suppressed, _ACCEPT_LOG_INTERVAL_S)
        self._last, self._suppressed = now, 0
