"""Tool calls in a model's own text (vLLM's `--tool-call-parser`), whole or as it streams:

  * hermes: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks (Qwen 2.5 and 3,
    Hermes); the text outside the blocks is the message's content;
  * llama3_json: the whole reply one JSON object `{"name": ..., "parameters": {...}}` (or
    several, `;`-separated), possibly after `<|python_tag|>` (Llama 3.1 / 3.2).

A block that is not a call (bad JSON, no name) leaves the text as content: what the model
wrote is never lost. Streaming, content goes out as it comes, except what may still turn out
to open a call (held back until it does or does not); a call goes out whole once closed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

OPEN, CLOSE = "<tool_call>", "</tool_call>"
PYTHON_TAG = "<|python_tag|>"


@dataclass(frozen=True)
class ParsedCall:
    name: str
    arguments: str  # JSON text of the arguments object


def _call(obj: Any, args_key: str) -> ParsedCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(args_key, obj.get("arguments", {}))
    if isinstance(args, str):  # some models write the arguments as JSON text already
        return ParsedCall(obj["name"], args)
    return ParsedCall(obj["name"], json.dumps(args, ensure_ascii=False))


def _json_call(body: str, args_key: str = "arguments") -> ParsedCall | None:
    try:
        return _call(json.loads(body), args_key)
    except ValueError:
        return None


class ToolStream(Protocol):
    def feed(self, text: str) -> tuple[str, list[ParsedCall]]: ...
    def finish(self) -> tuple[str, list[ParsedCall]]: ...


class ToolParser(Protocol):
    name: str

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]: ...
    def stream(self) -> ToolStream: ...


class HermesParser:
    name = "hermes"

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        """(the content, None when only calls; the calls); no calls: the whole text."""
        stream = HermesStream()
        content, calls = stream.feed(text)
        rest, last = stream.finish()
        if stream.refused:
            return text, []
        content = (content + rest).strip()
        return content or None, calls + last

    def stream(self) -> HermesStream:
        return HermesStream()


@dataclass
class HermesStream:
    pending: str = ""
    in_call: bool = False
    refused: bool = False  # a block that was not a call went out as text

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        self.pending += text
        out: list[str] = []
        calls: list[ParsedCall] = []
        while True:
            if not self.in_call:
                at = self.pending.find(OPEN)
                if at < 0:
                    send, self.pending = hold_back(self.pending, OPEN)
                    out.append(send)
                    return "".join(out), calls
                out.append(self.pending[:at])
                self.pending, self.in_call = self.pending[at + len(OPEN):], True
            at = self.pending.find(CLOSE)
            if at < 0:
                return "".join(out), calls
            body, self.pending, self.in_call = self.pending[:at], self.pending[at + len(CLOSE):], False
            call = _json_call(body)
            if call is None:
                self.refused = True
                out.append(OPEN + body + CLOSE)
            else:
                calls.append(call)

    def finish(self) -> tuple[str, list[ParsedCall]]:
        """The end of the reply: an unclosed block is a call if its JSON is whole."""
        rest, self.pending = self.pending, ""
        if not self.in_call:
            return rest, []
        call = _json_call(rest.strip())
        if call is None:
            self.refused = True
            return OPEN + rest, []
        return "", [call]


class Llama3JsonParser:
    name = "llama3_json"

    def parse(self, text: str) -> tuple[str | None, list[ParsedCall]]:
        body = text.strip()
        if body.startswith(PYTHON_TAG):
            body = body[len(PYTHON_TAG):].lstrip()
        if not body.startswith("{"):
            return text, []
        calls: list[ParsedCall] = []
        decoder, pos = json.JSONDecoder(), 0
        while pos < len(body):
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:
                return text, []
            call = _call(obj, "parameters")
            if call is None:
                return text, []
            calls.append(call)
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return None, calls

    def stream(self) -> Llama3JsonStream:
        return Llama3JsonStream(self)


@dataclass
class Llama3JsonStream:
    parser: Llama3JsonParser
    pending: str = ""
    calls: bool | None = None  # decided by the reply's first characters

    def feed(self, text: str) -> tuple[str, list[ParsedCall]]:
        if self.calls is False:
            return text, []
        self.pending += text
        head = self.pending.lstrip()
        if not head or (PYTHON_TAG.startswith(head) and len(head) < len(PYTHON_TAG)):
            return "", []  # undecided yet
        self.calls = head.startswith("{") or head.startswith(PYTHON_TAG)
        if self.calls:
            return "", []  # a call: parsed whole at the end
        out, self.pending = self.pending, ""
        return out, []

    def finish(self) -> tuple[str, list[ParsedCall]]:
        rest, self.pending = self.pending, ""
        if not rest:
            return "", []
        content, calls = self.parser.parse(rest)
        return content or "", calls


def hold_back(text: str, tag: str) -> tuple[str, str]:
    """(what may go out now, what is held back): the longest end of `text` that begins
    `tag` waits, since the next piece may complete the tag."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return text[:-n], text[-n:]
    return text, ""


PARSERS: dict[str, type] = {"hermes": HermesParser, "llama3_json": Llama3JsonParser}


def make_parser(name: str) -> ToolParser:
    try:
        return PARSERS[name]()
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(PARSERS)}") from None
