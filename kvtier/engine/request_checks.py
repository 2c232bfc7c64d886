"""What the engine checks of a request before it takes it (each a clear InvalidRequestError,
nothing added): its token ids within the vocabulary, its prompt within max_model_len, its
priority and logprobs within what the engine was started with."""

from __future__ import annotations

from kvtier.config import EngineConfig
from kvtier.sampling_params import InvalidRequestError, SamplingParams


def check_request(config: EngineConfig, params: SamplingParams, prompt_len: int,
                  priority: int) -> int:
    """The request's max_tokens, resolved against the room max_model_len leaves."""
    check_token_ids(params, config.model_config.vocab_size)
    max_tokens = resolve_max_tokens(config.scheduler.max_model_len, prompt_len, params)
    if priority and config.scheduler.schedule_policy != "priority":
        raise InvalidRequestError(f"priority {priority} needs --scheduling-policy priority")
    limit = config.logprobs_limit
    for name in ("logprobs", "prompt_logprobs"):
        k = getattr(params, name)
        if k is not None and k > limit:
            raise InvalidRequestError(f"{name} asks for {k}, more than max_logprobs {limit} "
                                      "(the engine's --max-logprobs)")
    return max_tokens


def check_token_ids(params: SamplingParams, vocab_size: int) -> None:
    """The ids a request names must be in the vocabulary (sorted: the last is the largest)."""
    if params.logit_bias and params.logit_bias[-1][0] >= vocab_size:
        raise InvalidRequestError("logit_bias has a token id outside the vocabulary")
    if params.allowed_token_ids and params.allowed_token_ids[-1] >= vocab_size:
        raise InvalidRequestError(f"allowed_token_ids has a token id outside the vocabulary "
                                  f"[0, {vocab_size})")


def resolve_max_tokens(max_model_len: int, prompt_len: int, params: SamplingParams) -> int:
    if prompt_len >= max_model_len:
        raise InvalidRequestError(
            f"prompt has {prompt_len} tokens; max_model_len is {max_model_len} "
            "(it must leave room for at least one generated token)"
        )
    room = max_model_len - prompt_len
    return room if params.max_tokens is None else min(params.max_tokens, room)
