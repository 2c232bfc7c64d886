"""OpenAI's Responses API request (`POST /v1/responses`) as the chat request it stands for:
`instructions` a system turn, `input` a string (one user turn) or items (messages, earlier
`function_call`s and their `function_call_output`s), Responses' flat function tools,
`text.format` the output format, `max_output_tokens` the length. kvtier keeps no responses:
`previous_response_id` is a 400 (send the conversation in `input`), and tools other than
functions, and content other than text, are refused by name."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from kvtier.server.api_models import INTEGRAL, ChatCompletionRequest, _Request, validate_as
from kvtier.server.errors import APIError

_TEXT_PARTS = ("input_text", "output_text", "text")


class ResponsesRequest(_Request):
    model: str | None = None
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: Any = None
    stream: bool = False
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    text: dict[str, Any] | None = None
    previous_response_id: str | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    store: bool | None = None  # nothing is ever stored; answered as false
    # vLLM's sampling extensions, passed on to the chat request as they are
    top_k: Any = None
    min_p: Any = None
    repetition_penalty: Any = None
    frequency_penalty: Any = None
    presence_penalty: Any = None
    logit_bias: Any = None
    stop: Any = None
    ignore_eos: Any = None
    cache_salt: Any = None

_PASSED_ON = ("seed", "top_k", "min_p", "repetition_penalty", "frequency_penalty",
              "presence_penalty", "logit_bias", "stop", "ignore_eos", "cache_salt")


def _bad(message: str, param: str) -> APIError:
    return APIError(400, message, param=param, code="invalid_value")


def _text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad("content is a string or a list of text parts", param)
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise APIError(400, f"content part of type {kind!r} is not supported (text only)",
                           param=f"{param}.{i}", code="unsupported_value")
        texts.append(part["text"])
    return "\n".join(texts)  # as chat's text parts (vLLM's join)


def _messages(req: ResponsesRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    if isinstance(req.input, str):
        return [*out, {"role": "user", "content": req.input}]
    for i, item in enumerate(req.input):
        param, kind = f"input.{i}", item.get("type", "message")
        if kind == "message":
            out.append({"role": item.get("role"), "content": _text(item.get("content"), param)})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments")}}
            last = out[-1] if out else None
            if last and last["role"] == "assistant" and last.get("tool_calls") and not last["content"]:
                last["tool_calls"].append(call)  # parallel calls: one assistant turn
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": item.get("call_id"),
                        "content": _text(item.get("output"), param)})
        elif kind != "reasoning":  # earlier thinking is not sent back to the template
            raise APIError(400, f"input item of type {kind!r} is not supported", param=param,
                           code="unsupported_value")
    return out


def _tools(req: ResponsesRequest) -> list[dict[str, Any]] | None:
    if not req.tools:
        return None
    tools = []
    for i, tool in enumerate(req.tools):
        if tool.get("type") != "function":
            raise APIError(400, f"tool of type {tool.get('type')!r} is not supported "
                           "(function tools are)", param=f"tools.{i}", code="unsupported_value")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": fn})
    return tools


def _tool_choice(choice: str | dict[str, Any] | None) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        return fmt
    spec = {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}
    return {"type": "json_schema", "json_schema": spec}


def as_chat(req: ResponsesRequest) -> ChatCompletionRequest:
    if req.previous_response_id is not None:
        raise _bad("previous_response_id is not supported: kvtier stores no responses; send "
                   "the conversation in input", "previous_response_id")
    extras = {k: getattr(req, k) for k in _PASSED_ON if getattr(req, k) is not None}
    body = {"model": req.model, "messages": _messages(req), "stream": req.stream,
            "max_completion_tokens": req.max_output_tokens, "temperature": req.temperature,
            "top_p": req.top_p, **extras, "tools": _tools(req),
            "tool_choice": _tool_choice(req.tool_choice),
            "parallel_tool_calls": req.parallel_tool_calls,
            "response_format": _response_format(req.text)}
    return validate_as(ChatCompletionRequest, body, _responses_loc)


_RENAMED = {"messages": "input", "max_completion_tokens": "max_output_tokens",
            "response_format": "text"}


def _responses_loc(loc: tuple) -> tuple:
    return ("body", _RENAMED.get(loc[0], loc[0]), *loc[1:]) if loc else ("body",)
