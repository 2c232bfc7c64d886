"""`POST /v1/responses` (OpenAI's Responses API): a chat request underneath
(kvtier/server/responses_request.py turns it into one; serving_chat.submit_chat runs it),
answered as a `response` whose output items are the reply's thinking (`reasoning`, under
`--reasoning-parser`), its text (`message`) and its tool calls (`function_call`), or
streamed as the API's typed events: response.created, .in_progress, then per item
output_item.added, its deltas and its .done events, and response.completed (or .incomplete
when cut by max_output_tokens)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request

from kvtier.server.chat_reply import StreamedReply, whole_reply
from kvtier.server.errors import FAILURE_STATUS
from kvtier.server.respond import respond
from kvtier.server.responses_request import ResponsesRequest, as_chat
from kvtier.server.results import Collected
from kvtier.server.serving_chat import SubmittedChat, submit_chat
from kvtier.server.state import ServerState
from kvtier.server.streaming import STREAM_FAILURES


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def text_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    return {"type": "message", "id": item_id, "status": status, "role": "assistant",
            "content": [text_part(text)] if status == "completed" else []}


def reasoning_item(item_id: str, text: str) -> dict[str, Any]:
    return {"type": "reasoning", "id": item_id, "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(item_id: str, call_id: str, name: str, arguments: str,
              status: str = "completed") -> dict[str, Any]:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": arguments, "status": status}


class ResponseShell:
    """The response object around its output, as each event and the answer carry it."""

    def __init__(self, req: ResponsesRequest, model: str, sub: SubmittedChat):
        self.req, self.model, self.sub = req, model, sub
        self.id, self.created_at = _id("resp"), int(time.time())

    def body(self, status: str, output: list[dict[str, Any]], finish_reason: str | None,
             num_output_tokens: int, cached: int) -> dict[str, Any]:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if finish_reason == "length" else None
        prompt = len(self.sub.prompt)
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "status": "incomplete" if incomplete and status == "completed" else status,
            "model": self.model, "output": output, "error": None,
            "incomplete_details": incomplete, "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens, "metadata": req.metadata or {},
            "parallel_tool_calls": req.parallel_tool_calls, "previous_response_id": None,
            "store": False, "temperature": req.temperature, "top_p": req.top_p,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or ("auto" if req.tools else "none"),
            "tools": req.tools or [], "truncation": "disabled", "user": req.user,
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": num_output_tokens,
                      "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + num_output_tokens},
        }


async def create_response(state: ServerState, req: ResponsesRequest, raw: Request) -> Any:
    chat = as_chat(req)
    model = state.resolve_model(chat.model)
    sub = await submit_chat(state, chat, id_prefix="resp")
    shell = ResponseShell(req, model, sub)

    def build(collected: Collected) -> dict[str, Any]:
        res = collected.choices[0]
        reasoning, content, calls, finish = whole_reply(sub.rules, res.text, res.finish_reason)
        output = [reasoning_item(_id("rs"), reasoning)] if reasoning else []
        if content or not calls:
            output.append(text_item(_id("msg"), content or ""))
        output += [call_item(_id("fc"), _id("call"), c.name, c.arguments) for c in calls]
        return shell.body("completed", output, finish, len(res.token_ids),
                          collected.num_cached_tokens)

    return await respond(state, raw, sub.stream, req.stream, 1,
                         lambda: ResponseEvents(shell).events(), build)


class ResponseEvents:
    """One response's stream of typed events (every event numbered in order)."""

    def __init__(self, shell: ResponseShell):
        self.shell = shell
        self.seq = 0
        self.done: dict[int, dict[str, Any]] = {}  # output index -> finished item
        self.text: tuple[int, str, list[str]] | None = None  # (index, item id, text so far)
        self.thinking: tuple[int, str, list[str]] | None = None
        self.calls: dict[int, dict[str, Any]] = {}  # the reply's call index -> its item
        self.num_items = 0

    def event(self, kind: str, **fields: Any) -> str:
        self.seq += 1
        body = {"type": kind, **fields, "sequence_number": self.seq - 1}
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"

    def new_index(self) -> int:
        """The output index of the next item opened (items are numbered as they open)."""
        self.num_items += 1
        return self.num_items - 1

    async def events(self) -> AsyncIterator[str]:
        shell, sub = self.shell, self.shell.sub
        yield self.event("response.created", response=shell.body("in_progress", [], None, 0, 0))
        yield self.event("response.in_progress", response=shell.body("in_progress", [], None, 0, 0))
        reply, tokens, cached, finish = StreamedReply(sub.rules), 0, 0, None
        try:
            async for update in sub.stream:
                cached = update.num_cached_tokens
                for delta in update.seqs:
                    tokens += len(delta.token_ids)
                    reasoning, content, calls, finish_now = reply.feed(delta.text,
                                                                       delta.finish_reason)
                    for out in self._reply_events(reasoning, content, calls):
                        yield out
                    finish = finish_now or finish
        except STREAM_FAILURES as exc:
            yield self.event("error", code=str(FAILURE_STATUS[type(exc)]), message=str(exc),
                             param=None)
            return
        for out in self._close_all():
            yield out
        output = [self.done[i] for i in sorted(self.done)]
        body = shell.body("completed", output, finish, tokens, cached)
        kind = "response.incomplete" if body["status"] == "incomplete" else "response.completed"
        yield self.event(kind, response=body)

    def _reply_events(self, reasoning: str | None, content: str | None,
                      calls: list[Any]) -> list[str]:
        out = []
        if reasoning:
            if self.thinking is None:
                self.thinking = (self.new_index(), _id("rs"), [])
                out.append(self.event("response.output_item.added", output_index=self.thinking[0],
                                      item={"type": "reasoning", "id": self.thinking[1],
                                            "summary": [], "content": []}))
            index, item_id, parts = self.thinking
            parts.append(reasoning)
            out.append(self.event("response.reasoning_text.delta", item_id=item_id,
                                  output_index=index, content_index=0, delta=reasoning))
        if content:
            out += self._close_thinking() + self._open_text()
            index, item_id, parts = self.text  # type: ignore[misc]
            parts.append(content)
            out.append(self.event("response.output_text.delta", item_id=item_id,
                                  output_index=index, content_index=0, delta=content,
                                  logprobs=[]))
        for call in calls:
            out += self._call_events(call)
        return out

    def _open_text(self) -> list[str]:
        if self.text is not None:
            return []
        self.text = (self.new_index(), _id("msg"), [])
        index, item_id, _ = self.text
        return [self.event("response.output_item.added", output_index=index,
                           item=text_item(item_id, "", status="in_progress")),
                self.event("response.content_part.added", item_id=item_id, output_index=index,
                           content_index=0, part=text_part(""))]

    def _call_events(self, call: Any) -> list[str]:
        out = []
        item = self.calls.get(call.index)
        if item is None:
            out += self._close_thinking()
            item = call_item(_id("fc"), call.id or _id("call"), call.function.name or "", "",
                             status="in_progress")
            item["output_index"] = self.new_index()
            self.calls[call.index] = item
            out.append(self.event("response.output_item.added", output_index=item["output_index"],
                                  item={k: v for k, v in item.items() if k != "output_index"}))
        if call.function.arguments:
            item["arguments"] += call.function.arguments
            out.append(self.event("response.function_call_arguments.delta", item_id=item["id"],
                                  output_index=item["output_index"], delta=call.function.arguments))
        return out

    def _close_thinking(self) -> list[str]:
        if self.thinking is None:
            return []
        index, item_id, parts = self.thinking
        self.thinking = None
        item = reasoning_item(item_id, "".join(parts))
        self.done[index] = item
        return [self.event("response.reasoning_text.done", item_id=item_id, output_index=index,
                           content_index=0, text="".join(parts)),
                self.event("response.output_item.done", output_index=index, item=item)]

    def _close_all(self) -> list[str]:
        out = self._close_thinking()
        if self.text is None and not self.calls:
            out += self._open_text()  # a reply with nothing to say still has its message
        if self.text is not None:
            index, item_id, parts = self.text
            self.text, text = None, "".join(parts)
            item = text_item(item_id, text)
            self.done[index] = item
            out += [self.event("response.output_text.done", item_id=item_id, output_index=index,
                               content_index=0, text=text, logprobs=[]),
                    self.event("response.content_part.done", item_id=item_id, output_index=index,
                               content_index=0, part=item["content"][0]),
                    self.event("response.output_item.done", output_index=index, item=item)]
        for item in self.calls.values():
            index = item.pop("output_index")
            item["status"] = "completed"
            self.done[index] = item
            out += [self.event("response.function_call_arguments.done", item_id=item["id"],
                               output_index=index, name=item["name"], arguments=item["arguments"]),
                    self.event("response.output_item.done", output_index=index, item=item)]
        return out
