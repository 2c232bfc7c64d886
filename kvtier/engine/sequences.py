"""The engine's bookkeeping of a request: one RequestGroup per added request, one SequenceState
per sampled sequence (n > 1 fans out into n), and what each hands out as output."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.core.request import Request
from kvtier.engine.detokenizer import IncrementalDetokenizer
from kvtier.engine.outputs import CompletionOutput, RequestMetrics
from kvtier.structured.requests import SequenceGrammar


@dataclass
class SequenceState:
    """One sampled sequence of a (possibly n > 1) request."""

    index: int
    request: Request
    detok: IncrementalDetokenizer | None
    logprobs: list[dict[int, float]] | None
    cumulative_logprob: float | None = None
    finish_reason: str | None = None
    grammar: SequenceGrammar | None = None  # structured outputs: its matcher


@dataclass
class RequestGroup:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    metrics: RequestMetrics
    final_only: bool = False
    children: list[SequenceState] = field(default_factory=list)
    # SamplingParams.prompt_logprobs: one entry a prompt token (None for the first), filled
    # as the prompt's chunks are scored; the first sequence scores them for all n. Outputs
    # hand out this list itself, not a copy a step: an output comes once a token is
    # sampled, when the prompt is scored whole (a re-prefill writes the same values).
    prompt_logprobs: list[dict[int, float] | None] | None = None

    def add_prompt_logprobs(self, scored: list[tuple[int, dict[int, float]]]) -> None:
        """A step's scores (a re-prefill after preemption scores them again: same values)."""
        if self.prompt_logprobs is not None:
            for pos, logprobs in scored:
                self.prompt_logprobs[pos] = logprobs

    @property
    def finished(self) -> bool:
        if len(self.children) == 1:  # the common case, on the per-token path
            return self.children[0].finish_reason is not None
        return all(c.finish_reason is not None for c in self.children)


def completion_output(c: SequenceState) -> CompletionOutput:
    # Positional arguments (index, text, token_ids, cumulative_logprob, logprobs,
    # finish_reason, stop_reason): a streaming step builds one per running request.
    req = c.request
    return CompletionOutput(
        c.index, c.detok.text if c.detok is not None else "",
        req.output_token_ids[:],  # a snapshot: the request keeps growing
        c.cumulative_logprob, c.logprobs[:] if c.logprobs is not None else None,
        c.finish_reason, req.stop_reason,
    )
