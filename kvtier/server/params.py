"""Turn a validated API request into prompt token ids and `SamplingParams`.

Everything a client can get wrong is checked here (or by pydantic before) and raised as a
400 `APIError`, so the engine only ever sees requests it can serve: token ids inside the
vocabulary, prompts that leave room to generate, `n` the scheduler can ever fit.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from kvtier.config import GenerationDefaults
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.server.api_models import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    _SamplingFields,
)
from kvtier.server.errors import APIError
from kvtier.server.structured import structured_outputs
from kvtier.server.tool_calls import template_calls, template_tools
from kvtier.structured.params import StructuredOutputsParams
from kvtier.tokenizer import check_template_kwargs

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServingLimits:
    max_model_len: int
    vocab_size: int
    max_num_seqs: int  # n above it could never be scheduled at once
    max_seqs_per_request: int  # prompts x n of one call
    # No token of the vocabulary decodes to more characters than this (+1 for a leading
    # space a tokenizer drops when decoding one token alone): a prompt with more than
    # max_model_len * max_token_chars characters cannot fit, and is refused untokenized.
    max_token_chars: int | None = None
    max_logprobs: int = 20  # the engine's --max-logprobs, resolved
    priority_scheduling: bool = False  # --scheduling-policy priority: `priority` may be != 0

    @property
    def max_prompt_chars(self) -> int | None:
        return None if self.max_token_chars is None else self.max_model_len * self.max_token_chars


def max_token_chars(tokenizer: Any, vocab_size: int) -> int | None:
    """The longest text one token id decodes to, +1 (see ServingLimits); None if unknown."""
    try:
        longest = max(len(tokenizer.decode([i], skip_special_tokens=False)) for i in range(vocab_size))
    except Exception as exc:  # an id the tokenizer lacks: no bound, prompts are still checked after
        logger.warning("cannot bound characters per token (%r); prompts are only checked tokenized", exc)
        return None
    return longest + 1


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    return APIError(400, message, param=param, code=code)


def _check_text(text: str, param: str) -> None:
    # JSON can carry lone surrogates ("\ud800") that no tokenizer can encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _bad(f"{param} is not valid Unicode text: {exc.reason}", param) from None


def encode_prompt(tokenizer: Any, text: str, param: str, add_special_tokens: bool) -> list[int]:
    """A text prompt's ids; without add_special_tokens (vLLM's field) what the tokenizer adds
    around it (a leading BOS) is left out."""
    _check_text(text, param)
    try:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    except Exception as exc:  # a tokenizer failing on a valid str is a client-visible 400
        logger.warning("tokenizer failed on %s: %r", param, exc)
        raise _bad(f"{param} could not be tokenized: {exc}", param) from None


def check_ids(ids: list[int], limits: ServingLimits, param: str) -> list[int]:
    for tok in ids:
        if not 0 <= tok < limits.vocab_size:
            raise _bad(f"{param}: token id {tok} is outside [0, {limits.vocab_size})", param)
    return ids


def one_prompt(req: CompletionRequest) -> bool:
    """A single prompt (text or token ids), not a list of them."""
    return isinstance(req.prompt, str) or all(isinstance(p, int) for p in req.prompt)


def num_prompts(req: CompletionRequest) -> int:
    return 1 if one_prompt(req) else len(req.prompt)


def check_before_tokenizing(req: _SamplingFields, limits: ServingLimits) -> int:
    """What can be refused without tokenizing (the tokenizer is a queue): a priority the
    server does not schedule by, sequences per request, and prompts with more characters
    than any `max_model_len` tokens can hold. Returns the request's number of sequences
    (prompts x n)."""
    if req.priority and not limits.priority_scheduling:
        raise _bad(f"priority {req.priority} needs the server started with --scheduling-policy "
                   "priority", "priority")
    num_seqs = req.n * (num_prompts(req) if isinstance(req, CompletionRequest) else 1)
    if num_seqs > limits.max_seqs_per_request:
        raise _bad(f"a request may ask for at most {limits.max_seqs_per_request} sequences "
                   f"(prompts x n); this one asks for {num_seqs}", "n", code="too_many_sequences")
    if req.truncate_prompt_tokens is not None:
        _check_truncation(req.truncate_prompt_tokens, limits)
        return num_seqs  # any length may come: the tokenized prompt is cut
    max_chars = limits.max_prompt_chars
    if max_chars is None:
        return num_seqs
    if isinstance(req, CompletionRequest):
        texts = [req.prompt] if isinstance(req.prompt, str) else [p for p in req.prompt if isinstance(p, str)]
        num_chars = max((len(t) for t in texts), default=0)
    else:
        num_chars = prompt_chars(req)
    if num_chars > max_chars:
        raise _bad(f"This model's maximum context length is {limits.max_model_len} tokens. However, "
                   f"your prompt has {num_chars} characters, more than {limits.max_model_len} tokens "
                   "can hold.", "messages" if isinstance(req, ChatCompletionRequest) else "prompt",
                   code="context_length_exceeded")
    return num_seqs


def _check_truncation(k: int, limits: ServingLimits) -> None:
    if k == 0:
        raise _bad("truncate_prompt_tokens must be -1 (max_model_len) or at least 1",
                   "truncate_prompt_tokens")
    if k > limits.max_model_len:
        raise _bad(f"truncate_prompt_tokens ({k}) is greater than max_model_len "
                   f"({limits.max_model_len}); select a smaller truncation size",
                   "truncate_prompt_tokens")


def truncated(prompts: list[list[int]], req: _SamplingFields,
              limits: ServingLimits) -> list[list[int]]:
    """vLLM's truncate_prompt_tokens: each prompt's last k tokens (-1: max_model_len)."""
    k = req.truncate_prompt_tokens
    if k is None:
        return prompts
    keep = limits.max_model_len if k == -1 else k
    return [p[-keep:] for p in prompts]


def prompt_chars(req: _SamplingFields) -> int:
    """Characters a request hands the tokenizer (what its time there grows with)."""
    if isinstance(req, CompletionRequest):
        prompt = req.prompt
        return len(prompt) if isinstance(prompt, str) else sum(len(p) for p in prompt if isinstance(p, str))
    if isinstance(req, ChatCompletionRequest):
        return sum(len(m.text()) for m in req.messages)
    return 0


def completion_prompts(req: CompletionRequest, tokenizer: Any, limits: ServingLimits) -> list[list[int]]:
    """Token ids of every prompt of a completions request (str, [str], [int] or [[int]])."""
    prompt, special = req.prompt, req.add_special_tokens
    if isinstance(prompt, str):
        return [encode_prompt(tokenizer, prompt, "prompt", special)]
    if all(isinstance(p, int) for p in prompt):
        return [check_ids([int(p) for p in prompt], limits, "prompt")]  # type: ignore[arg-type]
    prompts = []
    for i, p in enumerate(prompt):
        param = f"prompt.{i}"
        if isinstance(p, str):
            prompts.append(encode_prompt(tokenizer, p, param, special))
        elif isinstance(p, list):
            prompts.append(check_ids(list(p), limits, param))
    return prompts


def chat_prompt(req: ChatCompletionRequest, tokenizer: Any, limits: ServingLimits) -> list[int]:
    if req.continue_final_message and req.add_generation_prompt:
        raise _bad("continue_final_message needs add_generation_prompt false (the final "
                   "message is continued, no new turn is opened)", "continue_final_message")
    return chat_template_ids(req.messages, req.add_generation_prompt, tokenizer, limits,
                             template_tools(req.tools), req.chat_template_kwargs,
                             req.continue_final_message)


def _template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    try:
        return check_template_kwargs(kwargs)
    except ValueError as exc:
        raise _bad(str(exc), "chat_template_kwargs") from None


def chat_template_ids(chat: list[ChatMessage], add_generation_prompt: bool, tokenizer: Any,
                      limits: ServingLimits, tools: list[dict[str, Any]] | None = None,
                      template_kwargs: dict[str, Any] | None = None,
                      continue_final_message: bool = False) -> list[int]:
    """The messages (and the tools, if any) through the model's chat template, checked as
    a prompt; `template_kwargs` (vLLM's chat_template_kwargs) are the template's own
    variables."""
    messages = []
    for i, msg in enumerate(chat):
        text = msg.text()
        _check_text(text, f"messages.{i}.content")
        entry: dict[str, Any] = {"role": msg.role, "content": text}
        if msg.name is not None:
            entry["name"] = msg.name
        if msg.tool_calls:
            entry["tool_calls"] = template_calls(msg.tool_calls)
        if msg.tool_call_id is not None:
            entry["tool_call_id"] = msg.tool_call_id
        messages.append(entry)
    extra: dict[str, Any] = {} if tools is None else {"tools": tools}
    if kwargs := _template_kwargs(template_kwargs):
        extra["template_kwargs"] = kwargs
    if continue_final_message:
        extra["continue_final_message"] = True
    try:
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                            **extra)
    except Exception as exc:  # templates raise on conversations they do not accept
        raise _bad(f"messages do not fit the model's chat template: {exc}", "messages") from None
    return check_ids(list(ids), limits, "messages")


def check_lengths(
    prompts: list[list[int]], max_tokens: int | None, limits: ServingLimits, min_tokens: int = 0
) -> None:
    """vLLM's rule: prompt + max_tokens must fit max_model_len (OpenAI answers the same).

    So must prompt + min_tokens: the engine would otherwise generate past max_model_len
    (and fail its step, for every request in the batch).
    """
    longest = max(len(p) for p in prompts)
    if any(len(p) == 0 for p in prompts):
        raise _bad("prompt must not be empty", "prompt")
    if longest >= limits.max_model_len:
        raise _bad(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, "
            f"your prompt has {longest} tokens; at least one token must be left to generate.",
            "prompt",
            code="context_length_exceeded",
        )
    if longest + min_tokens > limits.max_model_len:
        raise _bad(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, "
            f"your prompt has {longest} tokens and min_tokens is {min_tokens}.",
            "min_tokens",
            code="context_length_exceeded",
        )
    if max_tokens is not None and longest + max_tokens > limits.max_model_len:
        raise _bad(
            f"This model's maximum context length is {limits.max_model_len} tokens. However, "
            f"you requested {longest + max_tokens} tokens ({longest} in the prompt, "
            f"{max_tokens} for the completion). Please reduce the prompt or max_tokens.",
            "max_tokens",
            code="context_length_exceeded",
        )


def _check_unsupported(req: _SamplingFields) -> None:
    if isinstance(req, CompletionRequest):
        if req.suffix:
            raise _bad("suffix is not supported", "suffix", code="unsupported_value")
        if req.best_of is not None and req.best_of != req.n:
            raise _bad("best_of other than n is not supported", "best_of", code="unsupported_value")
    if isinstance(req, ChatCompletionRequest):
        if req.top_logprobs is not None and not req.logprobs:
            raise _bad("top_logprobs requires logprobs to be true", "top_logprobs")


def _logit_bias(bias: dict[str, float] | None,
                vocab_size: int) -> tuple[tuple[int, float], ...]:
    """OpenAI's {"token id": bias}, ids in the vocabulary, each bias clipped to [-100, 100]
    as OpenAI and vLLM clip it."""
    out: dict[int, float] = {}
    for key, value in (bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise _bad(f"logit_bias keys are token ids, got {key!r}", "logit_bias") from None
        if value != value:
            raise _bad(f"logit_bias for token {token} is not a number", "logit_bias")
        if not 0 <= token < vocab_size:
            raise _bad(f"logit_bias token id {token} is outside the vocabulary "
                       f"[0, {vocab_size})", "logit_bias")
        out[token] = min(100.0, max(-100.0, value))
    return tuple(sorted(out.items()))


def _bad_words(words: list[str] | None) -> tuple[str, ...]:
    for i, word in enumerate(words or ()):
        _check_text(word, f"bad_words.{i}")
    return tuple(words or ())


def _allowed_ids(ids: list[int] | None, vocab_size: int) -> tuple[int, ...] | None:
    """vLLM's allowed_token_ids: ids in the vocabulary (SamplingParams refuses an empty
    list)."""
    if ids is None:
        return None
    outside = [t for t in ids if t >= vocab_size]
    if outside:
        raise _bad(f"allowed_token_ids has ids outside the vocabulary [0, {vocab_size}): "
                   f"{outside[:5]}", "allowed_token_ids")
    return tuple(ids)


def sampling_params(
    req: _SamplingFields, max_tokens: int | None, logprobs: int | None, limits: ServingLimits,
    tool_format: dict[str, Any] | None = None, defaults: GenerationDefaults = GenerationDefaults(),
) -> SamplingParams:
    """`tool_format`: the reply's format a tool_choice asks for (kvtier/server/tool_calls.py),
    which no other format may join. `defaults`: the model's (generation_config.json) for
    the sampling fields the request leaves unset; its max_tokens caps the request's, as
    vLLM's does."""
    _check_unsupported(req)
    fmt = structured_outputs(req)
    if tool_format is not None:
        if fmt is not None:
            raise _bad("tool_choice 'required' or a named function holds the reply to the "
                       "tools' schema; it cannot be combined with another output format",
                       "tool_choice")
        fmt = StructuredOutputsParams.coerce(tool_format)
    if req.n > limits.max_num_seqs:
        raise _bad(f"n must be at most {limits.max_num_seqs} (max_num_seqs), got {req.n}", "n")
    if logprobs is not None and logprobs > limits.max_logprobs:
        raise _bad(f"at most {limits.max_logprobs} logprobs a token (the server's --max-logprobs), "
                   f"got {logprobs}", "logprobs" if isinstance(req, CompletionRequest) else "top_logprobs")
    stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
    for i, s in enumerate(stop):
        _check_text(s, f"stop.{i}")
    try:
        return SamplingParams(
            n=req.n,
            temperature=_given(req.temperature, defaults, "temperature", 1.0),
            top_p=_given(req.top_p, defaults, "top_p", 1.0),
            top_k=_given(req.top_k, defaults, "top_k", -1),
            min_p=_given(req.min_p, defaults, "min_p", 0.0),
            seed=req.seed,
            max_tokens=_capped(max_tokens, defaults.get("max_tokens", None)),
            min_tokens=req.min_tokens,
            stop=tuple(stop),
            stop_token_ids=tuple(req.stop_token_ids or ()),
            ignore_eos=req.ignore_eos,
            logprobs=logprobs,
            # echo with logprobs: the prompt's too (kvtier/server/echo.py)
            prompt_logprobs=logprobs if isinstance(req, CompletionRequest) and req.echo else None,
            presence_penalty=req.presence_penalty or 0.0,
            frequency_penalty=req.frequency_penalty or 0.0,
            repetition_penalty=_given(req.repetition_penalty, defaults, "repetition_penalty", 1.0),
            logit_bias=_logit_bias(req.logit_bias, limits.vocab_size),
            allowed_token_ids=_allowed_ids(req.allowed_token_ids, limits.vocab_size),
            bad_words=_bad_words(req.bad_words),
            include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens,
            structured_outputs=fmt,
            cache_salt=req.cache_salt,
        )
    except InvalidRequestError as exc:
        raise _bad(str(exc)) from None


def _given(value: Any, defaults: GenerationDefaults, name: str, fallback: Any) -> Any:
    """The request's value, else the model's default, else kvtier's."""
    return defaults.get(name, fallback) if value is None else value


def _capped(max_tokens: int | None, default: int | None) -> int | None:
    return default if max_tokens is None else min(max_tokens, default or max_tokens)
