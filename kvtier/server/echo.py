"""Completions' `echo` (OpenAI's, as vLLM serves it): each choice's text starts with its
prompt, and with `logprobs` its logprobs start with the prompt's tokens, scored by the
engine (`SamplingParams.prompt_logprobs`; the first token has none). Streamed, a choice's
first chunk carries its prompt."""

from __future__ import annotations

from typing import Any

from kvtier.server.api_models import CompletionLogprobs, CompletionRequest
from kvtier.server.results import completion_logprobs

Scored = tuple[dict[int, float] | None, ...]


class Echo:
    """A call's prompts, to put before each choice's text (and logprobs)."""

    def __init__(self, req: CompletionRequest, prompts: list[list[int]], tokenizer: Any,
                 names: Any = None):
        """`names`: what names the prompt's tokens in logprobs (results.logprob_names;
        None: the tokenizer)."""
        self.prompts, self.k = prompts, req.logprobs
        self.tokenizer = tokenizer if names is None else names
        self.texts = prompt_texts(req, prompts, tokenizer)
        self.scored: dict[int, Scored] = {}  # streamed: by prompt index, as they come

    def prepend(self, prompt: int, text: str, logprobs: CompletionLogprobs | None,
                scored: Scored | None) -> tuple[str, CompletionLogprobs | None]:
        head = self.texts[prompt]
        if self.k is None:
            return head + text, logprobs
        return head + text, echoed_logprobs(self.tokenizer, self.prompts[prompt], scored,
                                            self.k, logprobs, head)


def prompt_texts(req: CompletionRequest, prompts: list[list[int]], tokenizer: Any) -> list[str]:
    """Each prompt as the client gave it: its text, or its token ids decoded."""
    given = req.prompt
    if isinstance(given, str):
        return [given]
    texts = []
    for i, ids in enumerate(prompts):
        item = given[i] if not all(isinstance(p, int) for p in given) else None
        texts.append(item if isinstance(item, str) else tokenizer.decode(ids))
    return texts


def echoed_logprobs(tokenizer: Any, prompt_ids: list[int], scored: Scored | None, k: int,
                    generated: CompletionLogprobs | None, prompt_text: str) -> CompletionLogprobs:
    """The prompt's logprobs (offsets from 0), then the generated tokens' (`generated`,
    whose offsets count from the end of the prompt's text)."""
    if scored is None:  # streamed before the prompt's scores came (n > 1): unknown
        scored = (None,) * len(prompt_ids)
    if len(scored) != len(prompt_ids):
        raise RuntimeError(f"{len(scored)} prompt logprobs for {len(prompt_ids)} tokens")
    out = completion_logprobs(tokenizer, prompt_ids[1:], [d or {} for d in scored[1:]], k, 0)
    first = tokenizer.decode(prompt_ids[:1])
    out.tokens.insert(0, first)
    out.token_logprobs.insert(0, None)
    out.top_logprobs.insert(0, None)
    out.text_offset = [0] + [o + len(first) for o in out.text_offset]
    if generated is not None:
        shift = len(prompt_text)
        out.tokens += generated.tokens
        out.token_logprobs += generated.token_logprobs
        out.top_logprobs += generated.top_logprobs
        out.text_offset += [o + shift for o in generated.text_offset]
    return out
