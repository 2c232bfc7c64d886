"""Per-request sampling options, named and validated like vLLM's."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.structured.params import StructuredOutputsError, StructuredOutputsParams


class InvalidRequestError(ValueError):
    """A request the engine refuses; nothing else is disturbed (the server maps it to 400)."""


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1: no top-k
    min_p: float = 0.0  # vLLM's: drop tokens below min_p x the likeliest token's probability
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; k >= 0: logprob of the chosen token (+ top-k)
    # vLLM's: each prompt token's logprob (+ the top k at its position); such a request is
    # not served from the prefix cache
    prompt_logprobs: int | None = None
    # vLLM's penalties: presence and frequency over the output tokens, repetition over the
    # prompt's and the output's (kvtier/runner/penalties.py applies them).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # {token id: bias} added to the logits before the penalties (given as a dict, kept as
    # sorted (id, bias) pairs so that the params stay hashable).
    logit_bias: tuple[tuple[int, float], ...] = ()
    # vLLM's: only these token ids may be drawn (the others' logits at -inf); None: any.
    allowed_token_ids: tuple[int, ...] | None = None
    # vLLM's: words never generated (the engine bans each one's last token where the output
    # ends with its others; kvtier/engine/token_options.py).
    bad_words: tuple[str, ...] = ()
    # vLLM's: the output held to a JSON schema, a regex, choices or a grammar (a dict of
    # StructuredOutputsParams' fields is accepted too; kvtier/structured/)
    structured_outputs: StructuredOutputsParams | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    detokenize: bool = True  # benchmarks with ignore_eos skip it, as vLLM's do
    # vLLM's request field `cache_salt`: mixed into the request's prefix-cache block hashes,
    # so only requests with the same salt share cached KV (tenants cannot probe each other's
    # prompts by their hit timing). vLLM carries it beside the sampling options; here it
    # rides with them, so every path a request takes (server, LLM, backlog, preemption, each
    # of n sequences) keeps it.
    cache_salt: str | None = None
    # "cumulative": an output every step (streaming); "final_only": only when finished
    # (offline generate: no per-step copies of every request's tokens).
    output_kind: str = "cumulative"
    extra: dict = field(default_factory=dict, compare=False)
    # Sampling reads the request's earlier tokens (kvtier/runner/penalties.py); set once
    # here, as the scheduler reads it for every sampling request every step.
    penalized: bool = field(init=False, default=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        # Accept lists / single strings the way users pass them, store tuples.
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        elif not isinstance(self.stop, tuple):
            object.__setattr__(self, "stop", tuple(self.stop or ()))
        if isinstance(self.bad_words, str):
            object.__setattr__(self, "bad_words", (self.bad_words,))
        elif not isinstance(self.bad_words, tuple):
            object.__setattr__(self, "bad_words", tuple(self.bad_words or ()))
        if not isinstance(self.stop_token_ids, tuple):
            object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids or ()))
        bias = self.logit_bias
        pairs = bias.items() if isinstance(bias, dict) else (bias or ())
        try:
            object.__setattr__(self, "logit_bias", tuple(sorted(
                (int(t), float(b)) for t, b in pairs)))
        except (TypeError, ValueError):
            raise InvalidRequestError("invalid sampling parameter: logit_bias maps token ids "
                                      f"to numbers, got {bias!r}") from None
        allowed = self.allowed_token_ids
        if allowed is not None:
            try:
                object.__setattr__(self, "allowed_token_ids",
                                   tuple(sorted({_token_id(t) for t in allowed})))
            except (TypeError, ValueError):
                raise InvalidRequestError("invalid sampling parameter: allowed_token_ids is a "
                                          f"list of token ids, got {allowed!r}") from None
        try:
            object.__setattr__(self, "structured_outputs",
                               StructuredOutputsParams.coerce(self.structured_outputs))
        except StructuredOutputsError as exc:
            raise InvalidRequestError(str(exc)) from None
        self.validate()
        object.__setattr__(self, "penalized", self.presence_penalty != 0.0
                           or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0)

    def validate(self) -> None:
        def bad(msg: str) -> InvalidRequestError:
            return InvalidRequestError(f"invalid sampling parameter: {msg}")

        if not isinstance(self.n, int) or self.n < 1:
            raise bad(f"n must be an integer >= 1, got {self.n!r}")
        if not (0.0 <= float(self.temperature) <= 100.0) or self.temperature != self.temperature:
            raise bad(f"temperature must be in [0, 100], got {self.temperature!r}")
        if not (0.0 < float(self.top_p) <= 1.0):
            raise bad(f"top_p must be in (0, 1], got {self.top_p!r}")
        if not (0.0 <= float(self.min_p) <= 1.0):
            raise bad(f"min_p must be in [0, 1], got {self.min_p!r}")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            raise bad(f"top_k must be -1 (off) or >= 1, got {self.top_k!r}")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            raise bad(f"max_tokens must be an integer >= 1, got {self.max_tokens!r}")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            raise bad(f"min_tokens must be >= 0, got {self.min_tokens!r}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise bad(f"min_tokens ({self.min_tokens}) exceeds max_tokens ({self.max_tokens})")
        for name in ("logprobs", "prompt_logprobs"):
            k = getattr(self, name)
            if k is not None and (not isinstance(k, int) or k < 0):  # the bound: the engine's
                raise bad(f"{name} must be an integer >= 0, got {k!r}")
        self._validate_penalties(bad)
        if self.output_kind not in ("cumulative", "final_only"):
            raise bad(f"output_kind must be 'cumulative' or 'final_only', got {self.output_kind!r}")
        if self.seed is not None and not isinstance(self.seed, int):
            raise bad(f"seed must be an integer, got {self.seed!r}")
        for s in self.stop:
            if not isinstance(s, str) or not s:
                raise bad(f"stop strings must be non-empty strings, got {s!r}")
        if self.allowed_token_ids is not None and (
                not self.allowed_token_ids or self.allowed_token_ids[0] < 0):
            raise bad(f"allowed_token_ids must be a non-empty list of token ids >= 0, got "
                      f"{list(self.allowed_token_ids)}")
        for w in self.bad_words:
            if not isinstance(w, str):
                raise bad(f"bad_words must be strings, got {w!r}")
        for t in self.stop_token_ids:
            if not isinstance(t, int) or t < 0:
                raise bad(f"stop_token_ids must be non-negative integers, got {t!r}")
        if self.cache_salt is not None and (not isinstance(self.cache_salt, str)
                                            or not self.cache_salt):
            raise bad(f"cache_salt must be a non-empty string, got {self.cache_salt!r}")

    def _validate_penalties(self, bad) -> None:
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not -2.0 <= float(value) <= 2.0:
                raise bad(f"{name} must be in [-2, 2], got {value!r}")
        if not float(self.repetition_penalty) > 0.0 or self.repetition_penalty == float("inf"):
            raise bad(f"repetition_penalty must be > 0, got {self.repetition_penalty!r}")
        for token, value in self.logit_bias:
            if token < 0 or value != value:
                raise bad(f"logit_bias needs token ids >= 0 and numeric biases, got "
                          f"{token}: {value}")

    @property
    def greedy(self) -> bool:
        return self.temperature < 1e-5 or self.top_k == 1


def _token_id(value: object) -> int:
    """An int token id (a bool or a float is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(value)
    return value
