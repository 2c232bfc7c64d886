"""Tool calling on /v1/chat/completions, as vLLM serves it:

  * the tools go to the chat template (`tools=`), and earlier calls and tool answers in the
    messages too, each call's arguments as an object;
  * tool_choice "none": the reply is text;
  * a named function: the reply is held to the function's parameters schema (structured
    outputs) and is that call's arguments (finish_reason as generated);
  * "required": the reply is held to a JSON array of {"name", "parameters"} over the tools
    (one item without parallel_tool_calls), each a call (finish_reason "tool_calls");
  * "auto" (the default with tools): the model's own text, read by the server's
    `--tool-call-parser` (kvtier/server/tool_parsers.py), which `--enable-auto-tool-choice`
    turns on; without it "auto" is a 400, as in vLLM.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any

from kvtier.server.api_models import (
    ChatCompletionRequest,
    DeltaFunctionCall,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    ToolSpec,
)
from kvtier.server.errors import APIError
from kvtier.server.tool_parsers import ParsedCall, ToolParser


@dataclass(frozen=True)
class ToolPlan:
    choice: str  # "none", "auto", "required" or "named"
    name: str | None = None  # the named function
    parser: ToolParser | None = None  # "auto"
    structured: dict[str, Any] | None = None  # named / required: the reply's format

    @property
    def reads_calls(self) -> bool:
        return self.choice in ("auto", "required", "named")


def _bad(message: str, param: str = "tool_choice") -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def plan_tools(req: ChatCompletionRequest, parser: ToolParser | None) -> ToolPlan:
    """What the request's tools ask of the reply; `parser`: the server's, None unless
    `--enable-auto-tool-choice`."""
    tools = {t.function.name: t.function for t in req.tools or ()}
    choice = req.tool_choice
    if choice is None:
        choice = "auto" if tools else "none"
    if not tools:
        if choice != "none":
            raise _bad("tool_choice needs tools")
        return ToolPlan("none")
    if not isinstance(choice, str):
        name = choice.function.name
        if name not in tools:
            raise _bad(f"tool_choice names {name!r}, which is not among the tools")
        return ToolPlan("named", name, structured={"json": _parameters(tools[name])})
    if choice == "required":
        return ToolPlan("required", structured={"json": _calls_schema(tools, req.parallel_tool_calls)})
    if choice == "auto" and parser is None:
        raise _bad('"auto" tool choice needs the server started with --enable-auto-tool-choice '
                   "and --tool-call-parser")
    return ToolPlan(choice, parser=parser if choice == "auto" else None)


def _parameters(function: Any) -> dict[str, Any]:
    return function.parameters or {"type": "object", "properties": {}}


def _calls_schema(tools: dict[str, Any], parallel: bool) -> dict[str, Any]:
    items = [{"type": "object", "properties": {"name": {"type": "string", "enum": [name]},
                                               "parameters": _parameters(fn)},
              "required": ["name", "parameters"], "additionalProperties": False}
             for name, fn in tools.items()]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def template_tools(tools: list[ToolSpec] | None) -> list[dict[str, Any]] | None:
    """A request's tools as the chat template takes them (OpenAI's shape, as HF templates
    expect): chat requests and /tokenize alike."""
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]


def template_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    """An assistant message's earlier calls for the template: arguments as an object where
    they are JSON (HF templates write them with `tojson`), as they came otherwise."""
    out = []
    for call in calls:
        try:
            args: Any = json.loads(call.function.arguments)
        except ValueError:
            args = call.function.arguments
        out.append({"id": call.id, "type": "function",
                    "function": {"name": call.function.name, "arguments": args}})
    return out


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def new_call(call: ParsedCall) -> ToolCall:
    return ToolCall(id=call_id(), function=FunctionCall(name=call.name, arguments=call.arguments))


def read_reply(plan: ToolPlan, text: str, finish_reason: str | None
               ) -> tuple[str | None, list[ParsedCall], str | None]:
    """(content, calls, finish_reason) of a whole reply."""
    if plan.choice == "named":
        assert plan.name is not None
        return None, [ParsedCall(plan.name, text)], finish_reason
    if plan.choice == "required":
        calls = _required_calls(text)
        if calls is None:  # cut short (length): the text as it is
            return text, [], finish_reason
        return None, calls, "tool_calls"
    assert plan.parser is not None, "plan_tools gives every auto plan the server's parser"
    content, calls = plan.parser.parse(text)
    return content, calls, "tool_calls" if calls else finish_reason


def _required_calls(text: str) -> list[ParsedCall] | None:
    try:
        items = json.loads(text)
    except ValueError:
        return None
    return [ParsedCall(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
            for item in items]


class ReplyStream:
    """One choice's reply as it streams: each update's (content, tool-call deltas,
    finish_reason). A named call streams its arguments as they come; "required" calls go out
    once the array is whole; "auto" calls once their block closes (the parser's stream)."""

    def __init__(self, plan: ToolPlan):
        self.plan = plan
        self._parts: list[str] = []
        self._calls = 0
        self._named_id: str | None = None
        self._auto = plan.parser.stream() if plan.parser is not None else None

    def feed(self, text: str, finish_reason: str | None
             ) -> tuple[str | None, list[DeltaToolCall], str | None]:
        plan = self.plan
        if plan.choice == "named":
            if self._named_id is None:
                self._named_id = call_id()
                fn = DeltaFunctionCall(name=plan.name, arguments=text)
                return None, [DeltaToolCall(index=0, id=self._named_id, type="function",
                                            function=fn)], finish_reason
            delta = [DeltaToolCall(index=0, function=DeltaFunctionCall(arguments=text))]
            return None, delta if text else [], finish_reason
        if plan.choice == "required":
            self._parts.append(text)
            if finish_reason is None:
                return None, [], None
            content, calls, finish = read_reply(plan, "".join(self._parts), finish_reason)
            return content, self._deltas(calls), finish
        assert self._auto is not None, "plan_tools gives every auto plan the server's parser"
        content, calls = self._auto.feed(text)
        if finish_reason is not None:
            rest, last = self._auto.finish()
            content, calls = content + rest, calls + last
        deltas = self._deltas(calls)
        if finish_reason is not None and self._calls:
            finish_reason = "tool_calls"
        return content or None, deltas, finish_reason

    def _deltas(self, calls: list[ParsedCall]) -> list[DeltaToolCall]:
        out = []
        for call in calls:
            out.append(DeltaToolCall(index=self._calls, id=call_id(), type="function",
                                     function=DeltaFunctionCall(name=call.name,
                                                                arguments=call.arguments)))
            self._calls += 1
        return out
