"""Collect a stream's deltas into whole choices, and render logprobs the OpenAI way."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvtier.server.api_models import (
    ChatLogprobs,
    ChatTokenLogprob,
    CompletionLogprobs,
    PromptTokensDetails,
    TopLogprob,
    UsageInfo,
)
from kvtier.server.async_engine import RequestStream
from kvtier.server.updates import RequestUpdate, SeqDelta

# JSON has no -inf; vLLM clamps the same way.
_MIN_LOGPROB = -9999.0


@dataclass
class ChoiceResult:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float]] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None

    def add(self, delta: SeqDelta) -> None:
        self.text += delta.text
        self.token_ids.extend(delta.token_ids)
        if delta.logprobs is not None:
            self.logprobs.extend(delta.logprobs)
        if delta.finished:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason
            if delta.final_text is not None:
                self.text = delta.final_text  # the engine's last word on the text


@dataclass
class CachedTokens:
    """Prompt tokens the prefix cache supplied, per engine request (one per prompt) of a
    call; every update carries its request's count (fixed at its first admission)."""

    by_request: dict[str, int] = field(default_factory=dict)

    def add(self, update: RequestUpdate) -> None:
        self.by_request[update.request_id] = update.num_cached_tokens

    @property
    def total(self) -> int:
        return sum(self.by_request.values())


@dataclass
class Collected:
    choices: list[ChoiceResult]  # indexed prompt_index * n + seq index
    num_cached_tokens: int  # over all prompts
    # by prompt index, for requests that asked for them (echo with logprobs)
    prompt_logprobs: dict[int, tuple[dict[int, float] | None, ...]] = field(
        default_factory=dict)
    cached_by_prompt: dict[int, int] = field(default_factory=dict)  # by prompt index


async def collect(stream: RequestStream, n: int) -> Collected:
    """All choices of a finished stream, and its prompts' cached tokens."""
    prompt_index = {rid: i for i, rid in enumerate(stream.request_ids)}
    choices = [ChoiceResult() for _ in range(len(stream.request_ids) * n)]
    cached = CachedTokens()
    prompt_lps = {}
    async for update in stream:
        cached.add(update)
        index = prompt_index[update.request_id]
        if update.prompt_logprobs is not None:
            prompt_lps[index] = update.prompt_logprobs
        for delta in update.seqs:
            choices[index * n + delta.index].add(delta)
    by_prompt = {prompt_index[rid]: n for rid, n in cached.by_request.items()}
    return Collected(choices, cached.total, prompt_lps, by_prompt)


def usage(num_prompt_tokens: int, num_completion_tokens: int,
          num_cached_tokens: int = 0) -> UsageInfo:
    return UsageInfo(
        prompt_tokens=num_prompt_tokens,
        completion_tokens=num_completion_tokens,
        total_tokens=num_prompt_tokens + num_completion_tokens,
        prompt_tokens_details=PromptTokensDetails(cached_tokens=num_cached_tokens),
    )


def clamp_logprob(value: float) -> float:
    return _MIN_LOGPROB if math.isnan(value) else max(value, _MIN_LOGPROB)


def top_entries(entries: dict[int, float], k: int) -> list[tuple[int, float]]:
    return sorted(entries.items(), key=lambda kv: kv[1], reverse=True)[:k]


class TokenIdNames:
    """vLLM's return_tokens_as_token_ids: logprobs name each token "token_id:{id}", so that
    one that is no text on its own (a byte of a multi-byte character) stays identifiable.
    Stands in for the tokenizer where logprobs decode a token to name it."""

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f"token_id:{i}" for i in ids)


def logprob_names(tokenizer: Any, as_ids: bool | None, server_default: bool) -> Any:
    """What names the tokens of a request's logprobs: its field, else the server's flag."""
    return TokenIdNames() if (server_default if as_ids is None else as_ids) else tokenizer


def completion_logprobs(
    tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, float]], k: int, offset: int
) -> CompletionLogprobs:
    """`offset`: length of the text before these tokens (streaming continues offsets).
    Each token's `top_logprobs` holds the k likeliest and the token itself (up to k + 1, as
    OpenAI's legacy completions and vLLM answer)."""
    out = CompletionLogprobs()
    for tok, entries in zip(token_ids, logprobs):
        text = tokenizer.decode([tok])
        out.tokens.append(text)
        chosen = entries.get(tok)
        out.token_logprobs.append(None if chosen is None else clamp_logprob(chosen))
        top = top_entries(entries, k)
        if entries and tok not in dict(top):  # no entries: a prompt token left unscored
            top.append((tok, chosen if chosen is not None else _MIN_LOGPROB))
        out.top_logprobs.append({tokenizer.decode([t]): clamp_logprob(v) for t, v in top})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def _top_logprob(tokenizer: Any, tok: int, value: float) -> TopLogprob:
    text = tokenizer.decode([tok])
    return TopLogprob(token=text, logprob=clamp_logprob(value), bytes=list(text.encode("utf-8", "replace")))


def chat_logprobs(
    tokenizer: Any, token_ids: list[int], logprobs: list[dict[int, float]], k: int
) -> ChatLogprobs:
    content = []
    for tok, entries in zip(token_ids, logprobs):
        chosen = _top_logprob(tokenizer, tok, entries.get(tok, _MIN_LOGPROB))
        content.append(
            ChatTokenLogprob(
                token=chosen.token,
                logprob=chosen.logprob,
                bytes=chosen.bytes,
                top_logprobs=[_top_logprob(tokenizer, t, v) for t, v in top_entries(entries, k)],
            )
        )
    return ChatLogprobs(content=content)
