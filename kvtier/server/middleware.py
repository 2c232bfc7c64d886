"""ASGI middleware: API-key check and request-body size limit, before FastAPI parses; vLLM's
X-Request-Id response header."""

from __future__ import annotations

import hmac
import uuid
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kvtier.server.errors import APIError, error_response

# A body over the limit is still read (and dropped) up to this size, so the client, which
# is still sending, gets to read our 413 instead of a reset connection.
_DRAIN_LIMIT_BYTES = 64 * 2**20


class APIKeyMiddleware:
    """`Authorization: Bearer <key>` (the scheme in any case, as RFC 9110 says) on the paths
    under `protected`; by default /v1/* only, so /health and /metrics stay open (as vLLM)."""

    def __init__(self, app: ASGIApp, api_key: str, protected: tuple[str, ...] = ("/v1",)) -> None:
        if not api_key:
            raise ValueError("the API key is empty")
        self.app = app
        self._expected = api_key.encode()
        self._protected = protected

    def _is_protected(self, path: str) -> bool:
        return any(path == p or path.startswith(p + "/") for p in self._protected)

    def _authorized(self, scope: Scope) -> bool:
        scheme, _, token = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self._expected)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._is_protected(scope["path"]) or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        response = error_response(
            401,
            "Incorrect API key provided. Pass it as 'Authorization: Bearer <key>'.",
            code="invalid_api_key",
            headers={"WWW-Authenticate": "Bearer"},
        )
        await response(scope, receive, send)


class RequestIdMiddleware:
    """vLLM's `--enable-request-id-headers`: every response carries `X-Request-Id`, the
    client's own when it sent one, else a new one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = dict(scope["headers"]).get(b"x-request-id") or uuid.uuid4().hex.encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)


class AdmissionMiddleware:
    """A POST to /v1/* while no sequence can be admitted (queue full, shutting down, engine
    dead) is answered 503 before its body is even read: a burst is refused at the cost of
    its headers, not of its JSON parsing and validation."""

    def __init__(self, app: ASGIApp, refusal: Callable[[], APIError | None]) -> None:
        self.app = app
        self._refusal = refusal

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"].startswith("/v1/"):
            refusal = self._refusal()
            if refusal is not None:
                headers = {**(refusal.headers or {}), "Connection": "close"}  # the body stays unread
                response = error_response(refusal.status, refusal.message, code=refusal.code, headers=headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyLimitMiddleware:
    """Reads the whole body first; over `max_bytes` answers 413 without parsing it."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > _DRAIN_LIMIT_BYTES:
            await self._reject(scope, receive, send)
            return
        body, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return  # the client left before finishing its body
            chunk = message.get("body", b"")
            size += len(chunk)
            if size <= self.max_bytes:
                body.append(chunk)
            elif size > _DRAIN_LIMIT_BYTES:
                break
            if not message.get("more_body", False):
                break
        if size > self.max_bytes:
            await self._reject(scope, receive, send)
            return
        await self.app(scope, _replay(b"".join(body), receive), send)

    async def _reject(self, scope: Scope, receive: Receive, send: Send) -> None:
        response = error_response(
            413,
            f"request body is larger than {self.max_bytes} bytes",
            code="request_too_large",
            headers={"Connection": "close"},
        )
        await response(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    raw = dict(scope["headers"]).get(b"content-length")
    try:
        return int(raw) if raw is not None else None
    except ValueError:
        return None


def _replay(body: bytes, receive: Receive) -> Receive:
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()  # afterwards: http.disconnect, which streaming watches for

    return replayed
