"""POST /v1/completions: prompts in, text out, whole or streamed."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from kvtier.server.api_models import CompletionChoice, CompletionRequest, CompletionResponse
from kvtier.server.async_engine import RequestStream
from kvtier.server.echo import Echo
from kvtier.server.params import (
    check_lengths,
    completion_prompts,
    prompt_chars,
    sampling_params,
    truncated,
)
from kvtier.server.respond import respond
from kvtier.server.results import CachedTokens, Collected, completion_logprobs, usage
from kvtier.server.state import ServerState
from kvtier.server.streaming import DONE, STREAM_FAILURES, failure_event, sse


@dataclass(frozen=True)
class Submitted:
    request_id: str
    prompts: list[list[int]]
    stream: RequestStream
    arrival_time: float


async def submit_completion(state: ServerState, req: CompletionRequest,
                            id_prefix: str = "cmpl") -> Submitted:
    """A completions request checked, tokenized and handed to the engine (also what SGLang's
    /generate becomes, kvtier/server/sglang_generate.py)."""
    arrival_time = state.async_engine.now()
    async with state.admitted(req) as seats:
        prompts = await state.tokenize(prompt_chars(req), completion_prompts, req, state.tokenizer,
                                       state.limits)
        prompts = truncated(prompts, req, state.limits)
        check_lengths(prompts, req.max_tokens, state.limits, req.min_tokens)
        params = sampling_params(req, req.max_tokens, req.logprobs, state.limits,
                                 defaults=state.generation_defaults)
        await state.compile_format(params)
        request_id = state.new_request_id(id_prefix)
        stream = await state.submit(request_id, prompts, params, arrival_time, seats, req.priority)
    return Submitted(request_id, prompts, stream, arrival_time)


async def create_completion(
    state: ServerState, req: CompletionRequest, raw: Request
) -> CompletionResponse | Response:
    model = state.resolve_model(req.model)
    submitted = await submit_completion(state, req)
    request_id, prompts, stream = submitted.request_id, submitted.prompts, submitted.stream
    num_prompt_tokens = sum(len(p) for p in prompts)
    names = state.logprob_names(req)
    echo = Echo(req, prompts, state.tokenizer, names) if req.echo else None

    def build(collected: Collected) -> CompletionResponse:
        results, choices = collected.choices, []
        for i, res in enumerate(results):
            logprobs = None
            if req.logprobs is not None:
                logprobs = completion_logprobs(
                    names, res.token_ids, res.logprobs, req.logprobs, 0)
            text = res.text
            if echo is not None:
                p = i // req.n
                text, logprobs = echo.prepend(p, text, logprobs, collected.prompt_logprobs.get(p))
            choices.append(
                CompletionChoice(
                    index=i,
                    text=text,
                    logprobs=logprobs,
                    finish_reason=res.finish_reason,
                    stop_reason=res.stop_reason,
                    token_ids=res.token_ids if req.return_token_ids else None,
                )
            )
        num_completion_tokens = sum(len(r.token_ids) for r in results)
        return CompletionResponse(
            id=request_id, model=model, choices=choices,
            usage=usage(num_prompt_tokens, num_completion_tokens, collected.num_cached_tokens),
        )

    return await respond(
        state, raw, stream, req.stream, req.n,
        lambda: _events(state, req, stream, request_id, model, num_prompt_tokens, echo),
        build,
    )


async def _events(
    state: ServerState,
    req: CompletionRequest,
    stream: RequestStream,
    request_id: str,
    model: str,
    num_prompt_tokens: int,
    echo: Echo | None,
) -> AsyncIterator[str]:
    prompt_index = state.prompt_index(stream)
    # choice index -> its generated tokens' text so far: logprobs' text_offset counts the
    # tokens' text, as the whole response's does, not the text sent (held back near a stop)
    offsets: dict[int, int] = {}
    num_completion_tokens = 0
    cached = CachedTokens()
    options = req.stream_options
    continuous = options is not None and options.continuous_usage_stats
    try:
        async for update in stream:
            cached.add(update)
            p = prompt_index[update.request_id]
            if echo is not None and update.prompt_logprobs is not None:
                echo.scored[p] = update.prompt_logprobs
            for delta in update.seqs:
                index = p * req.n + delta.index
                first, start = index not in offsets, offsets.get(index, 0)
                logprobs = None
                if req.logprobs is not None and delta.logprobs is not None:
                    head = len(echo.texts[p]) if echo is not None and not first else 0
                    logprobs = completion_logprobs(
                        state.logprob_names(req), list(delta.token_ids), list(delta.logprobs),
                        req.logprobs, start + head,
                    )
                    start += sum(map(len, logprobs.tokens))
                offsets[index] = start
                text = delta.text
                if echo is not None and first:  # a choice's first chunk
                    text, logprobs = echo.prepend(p, text, logprobs, echo.scored.get(p))
                num_completion_tokens += len(delta.token_ids)
                choice = CompletionChoice(
                    index=index,
                    text=text,
                    logprobs=logprobs,
                    finish_reason=delta.finish_reason,
                    stop_reason=delta.stop_reason,
                    token_ids=list(delta.token_ids) if req.return_token_ids else None,
                )
                so_far = (usage(num_prompt_tokens, num_completion_tokens, cached.total)
                          if continuous else None)
                yield sse(CompletionResponse(id=request_id, model=model, choices=[choice], usage=so_far))
        if options is not None and options.include_usage:
            final = usage(num_prompt_tokens, num_completion_tokens, cached.total)
            yield sse(CompletionResponse(id=request_id, model=model, choices=[], usage=final))
    except STREAM_FAILURES as exc:
        yield failure_event(exc)
    yield DONE
