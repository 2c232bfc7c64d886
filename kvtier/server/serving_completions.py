"""POST /v1/completions: prompts in, text out, whole or streamed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

from kvtier.server.api_models import (
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    UsageInfo,
)
from kvtier.server.async_engine import RequestStream
from kvtier.server.echo import Echo
from kvtier.server.errors import APIError
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


def max_tokens_as_vllm(req: CompletionRequest) -> tuple[CompletionRequest, bool]:
    """vLLM's reading of a completion's max_tokens 0: with `echo` it asks for the prompt
    alone (scored with `logprobs`: one token is generated and left out, as vLLM does; True
    then). Null stays null: the rest of the context, as vLLM's get_max_tokens reads it."""
    if req.max_tokens is None or req.max_tokens > 0:
        return req, False
    if not req.echo:
        raise APIError(400, "max_tokens must be at least 1, got 0 (0 only with echo: the "
                       "prompt alone)", param="max_tokens", code="invalid_value")
    return req.model_copy(update={"max_tokens": 1}), True


async def create_completion(
    state: ServerState, req: CompletionRequest, raw: Request
) -> CompletionResponse | Response:
    model = state.resolve_model(req.model)
    req, prompt_only = max_tokens_as_vllm(req)
    submitted = await submit_completion(state, req)
    request_id, prompts, stream = submitted.request_id, submitted.prompts, submitted.stream
    response_id = state.response_id("cmpl", request_id, raw, req.request_id)
    num_prompt_tokens = sum(len(p) for p in prompts)
    names = state.logprob_names(req)
    echo = Echo(req, prompts, state.tokenizer, names) if req.echo else None

    def build(collected: Collected) -> CompletionResponse:
        results, choices = collected.choices, []
        for i, res in enumerate(results):
            logprobs = None
            if req.logprobs is not None and not prompt_only:
                logprobs = completion_logprobs(
                    names, res.token_ids, res.logprobs, req.logprobs, 0)
            text = "" if prompt_only else res.text
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
            id=response_id, model=model, choices=choices,
            usage=usage(num_prompt_tokens, num_completion_tokens, collected.num_cached_tokens),
        )

    return await respond(
        state, raw, stream, req.stream, req.n,
        lambda: _events(state, req, stream, _Chunks(response_id, model), num_prompt_tokens,
                        echo, prompt_only),
        build,
    )


@dataclass(frozen=True)
class _Chunks:
    """What every chunk of one stream repeats: its id, model and `created` (one time for
    all, as OpenAI and vLLM stamp them)."""

    id: str
    model: str
    created: int = field(default_factory=lambda: int(time.time()))

    def sse(self, choices: list[CompletionChoice], so_far: UsageInfo | None) -> str:
        return sse(CompletionResponse(id=self.id, model=self.model, created=self.created,
                                      choices=choices, usage=so_far))


async def _events(
    state: ServerState,
    req: CompletionRequest,
    stream: RequestStream,
    chunks: _Chunks,
    num_prompt_tokens: int,
    echo: Echo | None,
    prompt_only: bool,
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
                if req.logprobs is not None and delta.logprobs is not None and not prompt_only:
                    head = len(echo.texts[p]) if echo is not None and not first else 0
                    logprobs = completion_logprobs(
                        state.logprob_names(req), list(delta.token_ids), list(delta.logprobs),
                        req.logprobs, start + head,
                    )
                    start += sum(map(len, logprobs.tokens))
                offsets[index] = start
                text = "" if prompt_only else delta.text
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
                yield chunks.sse([choice], so_far)
        if options is not None and options.include_usage:
            yield chunks.sse([], usage(num_prompt_tokens, num_completion_tokens, cached.total))
    except STREAM_FAILURES as exc:
        yield failure_event(exc)
    yield DONE
