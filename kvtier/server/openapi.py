"""The published OpenAPI schema, as the server behaves: no 422 (validation errors are 400)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_UNUSED_SCHEMAS = ("HTTPValidationError", "ValidationError")


def openapi_without_422(app: FastAPI) -> Callable[[], dict[str, Any]]:
    """`app.openapi` that drops FastAPI's default 422 responses: errors.py answers request
    validation errors with 400, which each route lists."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, summary=app.summary,
                                 routes=app.routes)
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    operation.get("responses", {}).pop("422", None)
            schemas = schema.get("components", {}).get("schemas", {})
            for name in _UNUSED_SCHEMAS:
                schemas.pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi
