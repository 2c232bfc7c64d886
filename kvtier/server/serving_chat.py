"""POST /v1/chat/completions: messages through the model's chat template, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from kvtier.server.api_models import (
    ChatCompletionChoice,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatCompletionStreamResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaMessage,
)
from kvtier.server.async_engine import RequestStream
from kvtier.server.chat_reply import ReplyRules, StreamedReply, whole_reply
from kvtier.server.params import (
    chat_prompt,
    check_lengths,
    prompt_chars,
    sampling_params,
    truncated,
)
from kvtier.server.respond import respond
from kvtier.server.results import CachedTokens, Collected, chat_logprobs, usage
from kvtier.server.state import ServerState
from kvtier.server.streaming import DONE, STREAM_FAILURES, failure_event, sse
from kvtier.server.tool_calls import new_call, plan_tools


@dataclass(frozen=True)
class SubmittedChat:
    request_id: str
    prompt: list[int]
    stream: RequestStream
    rules: ReplyRules  # how the reply reads: its thinking, its tool calls


async def submit_chat(state: ServerState, req: ChatCompletionRequest,
                      id_prefix: str = "chatcmpl") -> SubmittedChat:
    """A chat request checked, rendered through the template, tokenized and handed to the
    engine (also what a Responses API request becomes, kvtier/server/responses_api.py)."""
    arrival_time = state.async_engine.now()
    # max_completion_tokens is the newer name; None lets the engine fill the context.
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    tools = plan_tools(req, state.tool_parser)
    async with state.admitted(req) as seats:
        prompt = await state.tokenize(prompt_chars(req), chat_prompt, req, state.tokenizer, state.limits)
        prompt = truncated([prompt], req, state.limits)[0]
        check_lengths([prompt], max_tokens, state.limits, req.min_tokens)
        params = sampling_params(req, max_tokens, req.top_k_logprobs, state.limits, tools.structured,
                                 state.generation_defaults)
        rules = ReplyRules.of(tools, state.reasoning_parser, params)
        await state.compile_format(params)
        request_id = state.new_request_id(id_prefix)
        stream = await state.submit(request_id, [prompt], params, arrival_time, seats, req.priority)
    return SubmittedChat(request_id, prompt, stream, rules)


def echo_text(req: ChatCompletionRequest) -> str:
    """vLLM's chat echo: the final message's text when the reply continues it (an assistant
    message), else nothing."""
    last = req.messages[-1]
    return last.text() if req.echo and last.role == "assistant" else ""


async def create_chat_completion(
    state: ServerState, req: ChatCompletionRequest, raw: Request
) -> ChatCompletionResponse | Response:
    model = state.resolve_model(req.model)
    top_k_logprobs = req.top_k_logprobs
    sub = await submit_chat(state, req)
    request_id, prompt, stream, rules = sub.request_id, sub.prompt, sub.stream, sub.rules
    response_id = state.response_id("chatcmpl", request_id, raw, req.request_id)
    echoed = echo_text(req)

    def build(collected: Collected) -> ChatCompletionResponse:
        results, choices = collected.choices, []
        for i, res in enumerate(results):
            logprobs = None
            if top_k_logprobs is not None:
                logprobs = chat_logprobs(state.logprob_names(req), res.token_ids, res.logprobs,
                                         top_k_logprobs)
            reasoning, content, calls, finish_reason = whole_reply(rules, res.text,
                                                                   res.finish_reason)
            if echoed:
                content = echoed + (content or "")
            choices.append(
                ChatCompletionChoice(
                    index=i,
                    message=ChatResponseMessage(content=content, reasoning_content=reasoning,
                                                tool_calls=[new_call(c) for c in calls]),
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=res.stop_reason,
                    token_ids=res.token_ids if req.return_token_ids else None,
                )
            )
        num_completion_tokens = sum(len(r.token_ids) for r in results)
        return ChatCompletionResponse(
            id=response_id, model=model, choices=choices,
            usage=usage(len(prompt), num_completion_tokens, collected.num_cached_tokens),
        )

    return await respond(
        state, raw, stream, req.stream, req.n,
        lambda: _events(state, req, stream, response_id, model, len(prompt), top_k_logprobs,
                        rules),
        build,
    )


async def _events(
    state: ServerState,
    req: ChatCompletionRequest,
    stream: RequestStream,
    response_id: str,
    model: str,
    num_prompt_tokens: int,
    top_k_logprobs: int | None,
    rules: ReplyRules,
) -> AsyncIterator[str]:
    options = req.stream_options
    continuous = options is not None and options.continuous_usage_stats
    num_completion_tokens = 0
    cached = CachedTokens()
    replies: dict[int, StreamedReply] = {}  # each choice's thinking and tool calls
    created = int(time.time())  # one for every chunk, as OpenAI and vLLM stamp them

    def chunk(choices: list[ChatStreamChoice], last: bool = False) -> str:
        # The usage so far: include_usage's last chunk, and vLLM's continuous_usage_stats
        # (every chunk).
        so_far = (usage(num_prompt_tokens, num_completion_tokens, cached.total)
                  if continuous or last else None)
        return sse(ChatCompletionStreamResponse(id=response_id, model=model, created=created,
                                                choices=choices, usage=so_far))

    # OpenAI opens every choice with the role; content follows in later chunks (vLLM's echo:
    # the continued message's text first).
    for i in range(req.n):
        yield chunk([ChatStreamChoice(index=i, delta=DeltaMessage(role="assistant",
                                                                  content=echo_text(req)))])
    try:
        async for update in stream:
            cached.add(update)
            for delta in update.seqs:
                logprobs = None
                if top_k_logprobs is not None and delta.logprobs is not None:
                    logprobs = chat_logprobs(
                        state.logprob_names(req), list(delta.token_ids), list(delta.logprobs),
                        top_k_logprobs)
                num_completion_tokens += len(delta.token_ids)
                reply = replies.get(delta.index)
                if reply is None:
                    reply = replies[delta.index] = StreamedReply(rules)
                reasoning, content, calls, finish_reason = reply.feed(delta.text,
                                                                      delta.finish_reason)
                message = DeltaMessage(content=content, reasoning_content=reasoning,
                                       tool_calls=calls or None)
                yield chunk([ChatStreamChoice(
                    index=delta.index,
                    delta=message,
                    logprobs=logprobs,
                    finish_reason=finish_reason,
                    stop_reason=delta.stop_reason,
                    token_ids=list(delta.token_ids) if req.return_token_ids else None,
                )])
        if options is not None and options.include_usage:
            yield chunk([], last=True)
    except STREAM_FAILURES as exc:
        yield failure_event(exc)
    yield DONE
