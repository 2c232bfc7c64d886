"""vLLM's utility endpoints: `POST /tokenize`, `POST /detokenize`, `GET /version`, `/ping`.

/tokenize encodes exactly as the generation endpoints do (a `prompt` as /v1/completions, a
`messages` list through the chat template as /v1/chat/completions), so its `count` is the
`prompt_tokens` a completion of the same input reports. Both run on the tokenizer thread
under the same queue bound as the generation endpoints.
"""

from __future__ import annotations

from typing import Any

from kvtier.server.api_models import (
    DetokenizeRequest,
    DetokenizeResponse,
    TokenizeRequest,
    TokenizeResponse,
)
from kvtier.server.errors import APIError
from kvtier.server.params import chat_template_ids, check_ids, encode_prompt
from kvtier.server.state import ServerState
from kvtier.server.tool_calls import template_tools


def _tokenize(req: TokenizeRequest, state: ServerState) -> list[int]:
    tok, limits = state.tokenizer, state.limits
    if req.messages is not None:
        return chat_template_ids(req.messages, req.add_generation_prompt, tok, limits,
                                 template_tools(req.tools), req.chat_template_kwargs)
    assert req.prompt is not None
    return encode_prompt(tok, req.prompt, "prompt", req.add_special_tokens)


async def tokenize_response(state: ServerState, req: TokenizeRequest) -> TokenizeResponse:
    state.resolve_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of `prompt` and `messages`", param="prompt",
                       code="invalid_value")
    chars = len(req.prompt) if req.prompt is not None else sum(
        len(m.text()) for m in req.messages or [])
    ids = await state.tokenize(chars, _tokenize, req, state)
    return TokenizeResponse(count=len(ids), max_model_len=state.limits.max_model_len, tokens=ids)


def _detokenize(ids: list[int], state: ServerState) -> str:
    check_ids(ids, state.limits, "tokens")
    return str(state.tokenizer.decode(ids, skip_special_tokens=False))


async def detokenize_response(state: ServerState, req: DetokenizeRequest) -> DetokenizeResponse:
    state.resolve_model(req.model)
    text = await state.tokenize(len(req.tokens), _detokenize, list(req.tokens), state)
    return DetokenizeResponse(prompt=text)


def version() -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as package_version

    try:
        return {"version": package_version("kvtier")}
    except PackageNotFoundError:  # run from a source tree that was never installed
        return {"version": "unknown"}
