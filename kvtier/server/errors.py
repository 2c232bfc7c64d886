"""OpenAI-style error bodies, and the handlers that make every failure one of them.

Every error leaves the server as `{"error": {"message", "type", "param", "code"}}` with a
4xx status for anything the client did; a 5xx only for a broken engine. FastAPI's own
validation errors (422 by default) become 400, as OpenAI and vLLM answer them.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from kvtier.sampling_params import InvalidRequestError
from kvtier.server.api_models import ErrorInfo, ErrorResponse
from kvtier.server.streams import (
    EngineDeadError,
    RequestFailedError,
    RequestTimeoutError,
    ShuttingDownError,
)

logger = logging.getLogger(__name__)

# OpenAI's error "type" per status class.
_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    503: "service_unavailable",
}


# Exceptions that end a request after it was accepted, and the status each answers with.
FAILURE_STATUS: dict[type[BaseException], int] = {
    EngineDeadError: 503,
    ShuttingDownError: 503,
    RequestFailedError: 500,
    RequestTimeoutError: 408,
    InvalidRequestError: 400,  # a prompt the engine refused when it entered it
}


class APIError(Exception):
    """Raised anywhere in a handler; becomes an OpenAI error response."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers

    def body(self) -> ErrorResponse:
        return error_body(self.status, self.message, param=self.param, code=self.code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None
) -> ErrorResponse:
    kind = _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=code))


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = error_body(status, message, param=param, code=code)
    return JSONResponse(body.model_dump(), status_code=status, headers=headers)


# pydantic names the members of a union in an error's location ("list[str]",
# "function-before[_integral(), int]"): internal names, never a field of the API.
_FIELD = re.compile(r"[a-z_][a-z0-9_]*")
_TYPE_NAMES = {"str", "int", "float", "bool", "list", "dict", "none"}


def _is_member_label(part: Any) -> bool:
    return isinstance(part, str) and (not _FIELD.fullmatch(part) or part in _TYPE_NAMES)


def _loc_to_param(loc: Sequence[Any]) -> str | None:
    # ("body", "messages", 0, "role") -> "messages.0.role"; a union's member label and
    # whatever follows it -> the union's field
    parts: list[str] = []
    for p in loc:
        if _is_member_label(p):
            break
        if p != "body":
            parts.append(str(p))
    return ".".join(parts) or None


def _error_text(error: dict[str, Any]) -> str:
    if error.get("type") == "finite_number":
        return "must be a finite number, not NaN or Infinity"
    return str(error.get("msg", ""))


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "invalid request", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return "request body is not valid JSON", None
    by_param: dict[str, list[str]] = {}  # a union's members each add their reason
    for e in errors:
        texts = by_param.setdefault(_loc_to_param(e.get("loc", ())) or "body", [])
        if (text := _error_text(e)) not in texts:
            texts.append(text)
    msgs = [f"{param}: {' or '.join(texts)}" for param, texts in list(by_param.items())[:5]]
    return "; ".join(msgs), _loc_to_param(first.get("loc", ()))


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(
            exc.status, exc.message, param=exc.param, code=exc.code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, param = _validation_message(exc)
        return error_response(400, message, param=param, code="invalid_value")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        # 404 for unknown paths, 405 wrong method, 400 for bodies FastAPI cannot parse.
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return error_response(exc.status_code, detail, headers=getattr(exc, "headers", None))

    @app.exception_handler(EngineDeadError)
    @app.exception_handler(ShuttingDownError)
    async def _unavailable(_: Request, exc: Exception) -> JSONResponse:
        # Raised while a request was in flight (admission maps them in ServerState.submit).
        return error_response(503, str(exc), code="unavailable", headers={"Retry-After": "1"})

    @app.exception_handler(RequestFailedError)
    async def _failed(_: Request, exc: Exception) -> JSONResponse:
        return error_response(500, str(exc), code="engine_error")

    @app.exception_handler(RequestTimeoutError)
    async def _timed_out(_: Request, exc: Exception) -> JSONResponse:
        return error_response(408, str(exc), code="request_timeout")

    @app.exception_handler(InvalidRequestError)
    async def _refused(_: Request, exc: Exception) -> JSONResponse:
        return error_response(400, str(exc), code="invalid_value")

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        # A bug, never a client's fault: log it with its traceback, answer in OpenAI's format.
        logger.exception("unhandled error while serving a request", exc_info=exc)
        return error_response(500, "internal server error")
