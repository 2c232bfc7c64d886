"""What a request's output must follow: exactly one of a JSON schema, any JSON object, a
regular expression, a list of choices, or an EBNF grammar (vLLM's StructuredOutputsParams,
same field names). Torch-free and xgrammar-free: the grammar is compiled when the engine
admits the request (kvtier/structured/backend.py), where a bad schema or pattern is refused.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

_KINDS = ("json", "json_object", "regex", "choice", "grammar")


@dataclass(frozen=True)
class StructuredOutputsParams:
    # A JSON schema: a dict or its JSON text (kept as text, so params stay hashable; keys in
    # their order: a schema's order of properties is the order the output writes them).
    json: str | None = None
    json_object: bool = False  # any JSON object (OpenAI's response_format json_object)
    regex: str | None = None
    choice: tuple[str, ...] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # EBNF (GBNF, as llama.cpp and xgrammar write it)
    # vLLM's: JSON without free whitespace between its tokens (compact, as json.dumps writes)
    disable_any_whitespace: bool = False

    def __post_init__(self) -> None:
        schema: Any = self.json
        if schema is not None and not isinstance(schema, str):
            try:
                schema = json.dumps(schema)
            except (TypeError, ValueError) as exc:
                raise _bad(f"json must be a JSON schema, got {exc}") from None
            object.__setattr__(self, "json", schema)
        if self.choice is not None:
            if isinstance(self.choice, str) or not all(isinstance(c, str) for c in self.choice):
                raise _bad("choice must be a list of strings")
            object.__setattr__(self, "choice", tuple(self.choice))
            if not self.choice:
                raise _bad("choice must not be empty")
        set_kinds = [k for k in _KINDS if getattr(self, k) not in (None, False)]
        if len(set_kinds) != 1:
            raise _bad("exactly one of json, json_object, regex, choice and grammar must be "
                       f"set, got {set_kinds or 'none'}")
        for name in ("json", "regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value):
                raise _bad(f"{name} must be a non-empty string")

    @property
    def kind(self) -> str:
        return next(k for k in _KINDS if getattr(self, k) not in (None, False))

    @classmethod
    def coerce(cls, value: StructuredOutputsParams | dict | None
               ) -> StructuredOutputsParams | None:
        """The params from themselves or from a dict of their fields (as clients send them)."""
        if value is None or isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise _bad(f"expected an object of {', '.join(_KINDS)}, got {value!r}")
        unknown = set(value) - {*_KINDS, "disable_any_whitespace"}
        if unknown:
            raise _bad(f"unknown fields {sorted(unknown)}")
        return cls(**value)


class StructuredOutputsError(ValueError):
    """Params that ask for no output format, or more than one, or a malformed one
    (SamplingParams raises it again as its InvalidRequestError)."""


def _bad(message: str) -> StructuredOutputsError:
    return StructuredOutputsError(f"invalid structured_outputs: {message}")
