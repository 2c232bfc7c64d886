"""SGLang's native `POST /generate`: `text` or `input_ids` (one prompt or a batch) with
`sampling_params`, answered with `{"text", "output_ids", "meta_info"}` per sequence (a list
for a batch or n > 1), or streamed as server-sent events whose `text` is the sequence's text
so far (SGLang's; each event names its sequence's `index`), ending with `[DONE]`.

It is a completions request underneath (kvtier/server/serving_completions.py): the same
checks, admission, prefix cache and structured outputs (`json_schema`, `regex`, `ebnf`).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any

from pydantic import Field, model_validator
from starlette.requests import Request

from kvtier.server.api_models import INTEGRAL, CompletionRequest, _Request, validate_as
from kvtier.server.errors import APIError
from kvtier.server.params import one_prompt
from kvtier.server.respond import respond
from kvtier.server.results import ChoiceResult, Collected
from kvtier.server.serving_completions import Submitted, submit_completion
from kvtier.server.sglang_logprobs import logprob_meta
from kvtier.server.state import ServerState
from kvtier.server.streaming import DONE, STREAM_FAILURES, failure_event


class GenerateSamplingParams(_Request):
    """SGLang's names and defaults (max_new_tokens 128); ranges are checked as the
    completions request's."""

    max_new_tokens: Annotated[int, Field(ge=1), INTEGRAL] | None = 128
    min_new_tokens: Annotated[int, Field(ge=0), INTEGRAL] = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: Annotated[int, INTEGRAL] = -1
    min_p: float = 0.0
    stop: str | list[str] | None = None
    stop_token_ids: list[Annotated[int, INTEGRAL]] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: Annotated[int, INTEGRAL] = 1
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    # SGLang's names for what completions call seed, logit_bias, include_stop_str_in_output
    sampling_seed: Annotated[int, INTEGRAL] | None = None
    logit_bias: dict[str, float] | None = None
    no_stop_trim: bool = False


class GenerateRequest(_Request):
    text: str | list[str] | None = None
    input_ids: list[Annotated[int, INTEGRAL]] | list[list[Annotated[int, INTEGRAL]]] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    # SGLang's batch may give sampling params a prompt: kvtier runs a batch under one, so
    # the list (kept here, its first entry above) must give every prompt the same
    sampling_params_list: list[Any] | None = Field(default=None, exclude=True)
    rid: str | list[str] | None = None  # SGLang's request id: the answer's meta_info.id
    stream: bool = False
    return_logprob: bool = False  # SGLang's logprob fields (kvtier/server/sglang_logprobs.py)
    logprob_start_len: Annotated[int, INTEGRAL] = -1
    top_logprobs_num: Annotated[int, Field(ge=0), INTEGRAL] = 0
    return_text_in_logprobs: bool = False

    @model_validator(mode="before")
    @classmethod
    def _one_of_a_list(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("sampling_params"), list):
            given = data["sampling_params"]
            data = {**data, "sampling_params": given[0] if given else {},
                    "sampling_params_list": given}
        return data


def as_completion(req: GenerateRequest) -> CompletionRequest:
    """The completions request /generate stands for (its checks refuse what is bad)."""
    if (req.text is None) == (req.input_ids is None):
        raise APIError(400, "give exactly one of text and input_ids", param="text",
                       code="invalid_value")
    if req.return_logprob and req.logprob_start_len != -1:
        raise APIError(400, "input logprobs (logprob_start_len other than -1) are not "
                       "supported on /generate; output logprobs are", param="logprob_start_len",
                       code="unsupported_value")
    _check_batch_fields(req)
    sp = req.sampling_params
    body: dict[str, Any] = {
        "prompt": req.text if req.text is not None else req.input_ids,
        "max_tokens": sp.max_new_tokens, "min_tokens": sp.min_new_tokens,
        "temperature": float(sp.temperature), "top_p": float(sp.top_p), "top_k": sp.top_k,
        "min_p": float(sp.min_p), "stop": sp.stop, "stop_token_ids": sp.stop_token_ids,
        "ignore_eos": sp.ignore_eos, "skip_special_tokens": sp.skip_special_tokens, "n": sp.n,
        "frequency_penalty": float(sp.frequency_penalty),
        "presence_penalty": float(sp.presence_penalty),
        "repetition_penalty": float(sp.repetition_penalty),
        "regex": sp.regex, "ebnf": sp.ebnf, "stream": req.stream, "seed": sp.sampling_seed,
        "logit_bias": sp.logit_bias, "include_stop_str_in_output": sp.no_stop_trim,
        "logprobs": req.top_logprobs_num if req.return_logprob else None,
    }
    if sp.json_schema is not None:
        body["structured_outputs"] = {"json": sp.json_schema}
    return validate_as(CompletionRequest, body, _generate_loc)


def _num_prompts(req: GenerateRequest) -> int:
    prompts = req.text if req.text is not None else req.input_ids
    return len(prompts) if isinstance(prompts, list) and prompts and not isinstance(
        prompts[0], int) else 1


def _check_batch_fields(req: GenerateRequest) -> None:
    """SGLang's per-prompt lists: as long as the batch (one sampling params for all)."""
    num, given = _num_prompts(req), req.sampling_params_list
    if isinstance(req.rid, list) and len(req.rid) != num:
        raise APIError(400, f"rid gives {len(req.rid)} ids for {num} prompts", param="rid",
                       code="invalid_value")
    if given is None:
        return
    if len(given) != num:
        raise APIError(400, f"sampling_params gives {len(given)} for {num} prompts",
                       param="sampling_params", code="invalid_value")
    if any(other != given[0] for other in given[1:]):
        raise APIError(400, "different sampling_params within a batch are not supported: "
                       "send one request a prompt", param="sampling_params",
                       code="unsupported_value")


def _seq_id(req: GenerateRequest, request_id: str, index: int, n: int) -> str:
    """meta_info.id of sequence `index` (prompt index // n): SGLang's `rid` where given
    (`{rid}_{index}` in a batch, a list's entry a prompt), else kvtier's own id."""
    prompt, seq = divmod(index, n)
    if isinstance(req.rid, list):
        return req.rid[prompt] + (f"_{seq}" if n > 1 else "")
    if req.rid is not None:
        return req.rid if _num_prompts(req) * n == 1 else f"{req.rid}_{index}"
    return f"{request_id}-{prompt}" + (f"-{seq}" if seq else "")


_RENAMED = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens",
            "structured_outputs": "json_schema", "logprobs": "top_logprobs_num"}


def _generate_loc(loc: tuple) -> tuple:
    if not loc or loc[0] == "prompt":
        return ("body", "text", *loc[1:])
    if loc[0] == "logprobs":
        return ("body", "top_logprobs_num", *loc[1:])
    return ("body", "sampling_params", _RENAMED.get(loc[0], loc[0]), *loc[1:])


def finish_reason(res: ChoiceResult) -> dict[str, Any] | None:
    """SGLang's shape: the stop that matched (a stop string or token id), or the length."""
    if res.finish_reason is None:
        return None
    if res.finish_reason == "length":
        return {"type": "length", "length": len(res.token_ids)}
    if res.finish_reason == "stop":
        matched = res.stop_reason if res.stop_reason is not None else (
            res.token_ids[-1] if res.token_ids else None)
        return {"type": "stop", "matched": matched}
    return {"type": res.finish_reason}


async def create_generate(state: ServerState, req: GenerateRequest, raw: Request) -> Any:
    completion = as_completion(req)
    n = completion.n
    sub = await submit_completion(state, completion, id_prefix="generate")
    batch = n > 1 or not one_prompt(completion)  # SGLang answers a list for a batch

    def item(i: int, res: ChoiceResult, cached: int) -> dict[str, Any]:
        return {"text": res.text, "output_ids": res.token_ids,
                "meta_info": _meta(sub, state, req, i, n, res, cached)}

    def build(collected: Collected) -> Any:
        items = [item(i, res, collected.cached_by_prompt.get(i // n, 0))
                 for i, res in enumerate(collected.choices)]
        return items if batch else items[0]

    return await respond(state, raw, sub.stream, req.stream, n,
                         lambda: _events(state, sub, req, n), build)


def _meta(sub: Submitted, state: ServerState, req: GenerateRequest, index: int, n: int,
          res: ChoiceResult, cached: int) -> dict[str, Any]:
    meta = {"id": _seq_id(req, sub.request_id, index, n),
            "finish_reason": finish_reason(res), "prompt_tokens": len(sub.prompts[index // n]),
            "completion_tokens": len(res.token_ids), "cached_tokens": cached,
            "e2e_latency": state.async_engine.now() - sub.arrival_time}
    if req.return_logprob:
        meta.update(logprob_meta(state.tokenizer, res, req.top_logprobs_num,
                                 req.return_text_in_logprobs))
    return meta


async def _events(state: ServerState, sub: Submitted, req: GenerateRequest,
                  n: int) -> AsyncIterator[str]:
    prompt_index = state.prompt_index(sub.stream)
    so_far: dict[int, ChoiceResult] = {}
    try:
        async for update in sub.stream:
            p = prompt_index[update.request_id]
            for delta in update.seqs:
                index = p * n + delta.index
                res = so_far.setdefault(index, ChoiceResult())
                res.add(delta)
                # SGLang's: text and output_ids both the sequence's so far
                event = {"text": res.text, "output_ids": res.token_ids, "meta_info": _meta(
                    sub, state, req, index, n, res, update.num_cached_tokens),
                    "index": index}
                yield f"data: {json.dumps(event, ensure_ascii=False)}\n\n"
    except STREAM_FAILURES as exc:
        yield failure_event(exc)
    yield DONE
