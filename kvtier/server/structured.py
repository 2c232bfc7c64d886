"""A request's output format from the fields clients send for it, as vLLM and SGLang read
them: OpenAI's `response_format` (json_object, json_schema), vLLM's `structured_outputs`
object and its older `guided_json` / `guided_regex` / `guided_choice` / `guided_grammar`,
SGLang's `regex` and `ebnf`. At most one may ask for a format; a malformed one is a 400 that
names the field (the grammar itself is compiled, and refused if bad, when the engine admits
the request)."""

from __future__ import annotations

from typing import Any

from kvtier.server.api_models import _SamplingFields
from kvtier.server.errors import APIError
from kvtier.structured.params import StructuredOutputsError, StructuredOutputsParams

# Field name -> the StructuredOutputsParams field it fills.
_SINGLE_FIELDS = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
                  "guided_grammar": "grammar", "regex": "regex", "ebnf": "grammar"}


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _response_format(fmt: dict[str, Any]) -> dict[str, Any] | None:
    kind = fmt.get("type", "text")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise _bad("response_format json_schema needs json_schema.schema, a JSON schema "
                       "object", "response_format")
        return {"json": schema}
    raise APIError(400, f"response_format {kind!r} is not supported (text, json_object, "
                   "json_schema are)", param="response_format", code="unsupported_value")


def structured_outputs(req: _SamplingFields) -> StructuredOutputsParams | None:
    """The request's format, None when it asks for none."""
    asked: list[tuple[str, dict[str, Any]]] = []
    if req.response_format is not None:
        spec = _response_format(req.response_format)
        if spec is not None:
            asked.append(("response_format", spec))
    if req.structured_outputs is not None:
        asked.append(("structured_outputs", dict(req.structured_outputs)))
    for name, field in _SINGLE_FIELDS.items():
        value = getattr(req, name)
        if value is not None:
            asked.append((name, {field: value}))
    if not asked:
        return None
    if len(asked) > 1:
        names = ", ".join(name for name, _ in asked)
        raise _bad(f"at most one output format may be given, got {names}", asked[1][0])
    name, spec = asked[0]
    try:
        return StructuredOutputsParams.coerce(spec)
    except StructuredOutputsError as exc:
        raise _bad(str(exc), name) from None
