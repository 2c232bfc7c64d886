"""Request and response bodies of the OpenAI protocol (completions, chat, models, errors).

Field names, defaults and shapes follow OpenAI's API reference; vLLM's extensions that the
engine supports (`top_k`, `min_tokens`, `ignore_eos`, `stop_token_ids`, ...) are accepted
too. Ranges are declared here so the OpenAPI schema documents them; `SamplingParams`
validates again (the engine's own contract). Unknown fields are ignored, as OpenAI does.
Types are strict: `"max_tokens": true` or `"16"` is a client bug, answered with 400.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

# torch.Generator seeds are 64-bit; larger values would fail inside the engine step.
MAX_SEED = 2**63 - 1


def _integral(value: object) -> object:
    # JSON Schema counts 2.0 as an integer; strict ints would refuse it (bools and "2" stay refused).
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# The integral check runs before the int's own (strict) validation, and the range belongs
# to the int: written `Annotated[int, Field(ge=...), INTEGRAL]`, the OpenAPI schema shows
# JSON Schema's minimum/maximum.
INTEGRAL = BeforeValidator(_integral)
Int = Annotated[int, INTEGRAL]
NonEmptyStr = Annotated[str, Field(min_length=1)]


class _Request(BaseModel):
    # NaN and Infinity (Python's json reads them) are refused: no range check catches NaN.
    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


_R = TypeVar("_R", bound=_Request)


def validate_as(model: type[_R], body: dict[str, Any], loc: Callable[[tuple], tuple]) -> _R:
    """`body` (another endpoint's request rewritten) as `model`; a field it refuses is a 400
    whose location `loc` maps back to the field as the client sent it."""
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise RequestValidationError([{**e, "loc": loc(e["loc"])} for e in exc.errors()]) from None


# --------------------------------------------------------------------------- shared pieces
class StreamOptions(_Request):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage in every chunk


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache


class UsageInfo(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    # OpenAI's, always present (vLLM sends it only with --enable-prompt-tokens-details).
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)


class ErrorInfo(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo


class _SamplingFields(_Request):
    """The sampling options both endpoints share."""

    model: str | None = None  # None: the (first) served model, as vLLM allows
    n: Annotated[int, Field(ge=1, le=128), INTEGRAL] = 1
    temperature: Annotated[float, Field(ge=0.0, le=100.0)] | None = None
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    seed: Annotated[int, Field(ge=0, le=MAX_SEED), INTEGRAL] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    frequency_penalty: Annotated[float, Field(ge=-2.0, le=2.0)] | None = None
    logit_bias: dict[str, float] | None = None  # token id -> bias, clipped to [-100, 100]
    repetition_penalty: Annotated[float, Field(gt=0.0)] | None = None  # vLLM's
    min_p: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    # vLLM extensions the engine implements.
    top_k: Annotated[int, Field(ge=-1), INTEGRAL] | None = None
    min_tokens: Annotated[int, Field(ge=0), INTEGRAL] = 0
    ignore_eos: bool = False
    stop_token_ids: list[Annotated[int, Field(ge=0), INTEGRAL]] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # vLLM's: only these token ids may be drawn.
    allowed_token_ids: list[Annotated[int, Field(ge=0), INTEGRAL]] | None = None
    # vLLM's: words the output never holds.
    bad_words: list[str] | None = None
    # vLLM's: logprobs name tokens "token_id:{id}" (None: the server's
    # --return-tokens-as-token-ids).
    return_tokens_as_token_ids: bool | None = None
    # Under --scheduling-policy priority, lower values are admitted (and kept running) first;
    # otherwise only 0 is accepted (vLLM's field and rule).
    priority: Annotated[int, INTEGRAL] = 0
    # vLLM's: only requests with the same salt share prefix-cached KV (SamplingParams).
    cache_salt: NonEmptyStr | None = None
    # vLLM's: keep only each prompt's last k tokens (-1: max_model_len of them).
    truncate_prompt_tokens: Annotated[int, Field(ge=-1), INTEGRAL] | None = None
    # vLLM's: the response's id is "{prefix}-{request_id}" (an X-Request-Id header wins)
    request_id: NonEmptyStr | None = None
    # vLLM's extension: each choice (and each streamed chunk) also carries its token ids,
    # which is how the HTTP benchmark backend stamps every token exactly.
    return_token_ids: bool = False
    # Structured outputs (kvtier/server/structured.py): OpenAI's response_format, vLLM's
    # structured_outputs and its older guided_* fields, SGLang's regex and ebnf.
    response_format: dict[str, Any] | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    regex: str | None = None
    ebnf: str | None = None

    @field_validator("stream_options")
    @classmethod
    def _stream_options_need_stream(cls, value: StreamOptions | None,
                                    info: ValidationInfo) -> StreamOptions | None:
        # vLLM's rule (a client bug, not a no-op; an empty object passes); `stream` comes first.
        if value is not None and value.model_fields_set and not info.data.get("stream"):
            raise ValueError("stream_options can only be given when stream is true")
        return value


# --------------------------------------------------------------------------- completions
class CompletionRequest(_SamplingFields):
    # str | list[str] | list[int] | list[list[int]], as OpenAI accepts.
    prompt: (
        NonEmptyStr
        | Annotated[list[str], Field(min_length=1)]
        | Annotated[list[Int], Field(min_length=1)]
        | Annotated[list[Annotated[list[Int], Field(min_length=1)]], Field(min_length=1)]
    )
    # null: 16 too; 0 only with echo (the prompt alone, vLLM's): serving_completions.py
    max_tokens: Annotated[int, Field(ge=0), INTEGRAL] | None = 16
    logprobs: Annotated[int, Field(ge=0), INTEGRAL] | None = None
    echo: bool = False
    best_of: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    suffix: str | None = None
    add_special_tokens: bool = True  # vLLM's: False leaves out what the tokenizer adds (a leading BOS)


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


def _omitted_when_none() -> Any:
    return Field(default=None, exclude_if=lambda v: v is None)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _omitted_when_none()  # only with return_token_ids


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


# A streamed completion chunk has the same shape as the full response (OpenAI reuses it).
CompletionStreamResponse = CompletionResponse


# --------------------------------------------------------------------------- chat
class TextContentPart(_Request):
    type: Literal["text"]
    text: str


class FunctionCall(_Request):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(_Request):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer: to which call

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content)  # vLLM joins parts so


class FunctionSpec(_Request):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.-]+$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None


class ToolSpec(_Request):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(_Request):
    name: str


class NamedToolChoice(_Request):
    type: Literal["function"]
    function: NamedFunction


class ChatCompletionRequest(_SamplingFields):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(ge=0), INTEGRAL] | None = None
    add_generation_prompt: bool = True
    # vLLM's: the final (assistant) message left open, the reply continuing it ("prefill");
    # needs add_generation_prompt false. echo: the reply starts with that message's text.
    continue_final_message: bool = False
    echo: bool = False
    # vLLM's: the chat template's own variables (e.g. Qwen3's {"enable_thinking": false})
    chat_template_kwargs: dict[str, Any] | None = None
    # Tool calling (kvtier/server/tool_calls.py): OpenAI's fields.
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True

    @property
    def top_k_logprobs(self) -> int | None:
        """Top logprobs a token (0: the sampled token's only); None without logprobs."""
        return (self.top_logprobs or 0) if self.logprobs else None


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)  # as vLLM: [] without calls
    reasoning_content: str | None = _omitted_when_none()  # vLLM's, under --reasoning-parser


class DeltaFunctionCall(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall


class ChatCompletionChoice(BaseModel):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _omitted_when_none()  # only with return_token_ids


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionChoice]
    usage: UsageInfo
    system_fingerprint: str | None = None


class DeltaMessage(BaseModel):
    role: Literal["assistant"] | None = _omitted_when_none()  # the first chunk's only
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = _omitted_when_none()
    reasoning_content: str | None = _omitted_when_none()


class ChatStreamChoice(BaseModel):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = _omitted_when_none()  # only with return_token_ids


class ChatCompletionStreamResponse(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None
    system_fingerprint: str | None = None


# --------------------------------------------------------------------------- vLLM utilities
class TokenizeRequest(_Request):
    """vLLM's two shapes in one: `prompt` (completions) or `messages` (chat)."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1)] | None = None
    add_special_tokens: bool = True  # completions: False leaves out what the tokenizer adds
    add_generation_prompt: bool = True  # chat: the assistant header after the messages
    chat_template_kwargs: dict[str, Any] | None = None  # chat: the template's own variables
    tools: list[ToolSpec] | None = None  # chat: the tools, as a chat request's template sees them


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int | None
    tokens: list[int]


class DetokenizeRequest(_Request):
    model: str | None = None
    tokens: list[Int]


class DetokenizeResponse(BaseModel):
    prompt: str
