"""A request as the scheduler sees it: token ids and counts, never tensors.

Scheduling state is counts, not phases: a request has `num_tokens` (prompt + generated) and
`num_computed_tokens` (those whose KV is in the cache); each step computes some of the gap.
A prefill is a large gap, a decode a gap of one; chunked prefill falls out of that.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from kvtier.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # never scheduled, or preempted with its KV dropped
    RUNNING = "running"
    SWAPPED = "swapped"  # preempted with its KV moved to the host pool
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    def __init__(self, value: str) -> None:
        # A plain attribute, not a property over `.value` (an enum descriptor): it is read
        # for every request every step.
        self.finished: bool = value in ("stop", "length", "abort")


@dataclass(eq=False)
class Request:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    max_tokens: int  # resolved: never beyond max_model_len - prompt length
    eos_token_ids: tuple[int, ...] = ()
    arrival_time: float = 0.0
    priority: int = 0  # --scheduling-policy priority: lower values run first (vLLM's)
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_preemptions: int = 0
    num_prompt_tokens_seen: int = 0  # prompt tokens computed at least once (not recomputes)
    # Prompt tokens whose KV came from the prefix cache at its first admission (vLLM's
    # num_cached_tokens); None until it is admitted.
    num_cached_tokens: int | None = None
    # Async scheduling: tokens sampled by a step still in flight, not yet appended (0 or 1).
    num_pending_tokens: int = 0

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    def token_ids_slice(self, start: int, end: int) -> list[int]:
        n = self.num_prompt_tokens
        if end <= n:
            return self.prompt_token_ids[start:end]
        if start >= n:
            return self.output_token_ids[start - n : end - n]
        return self.prompt_token_ids[start:] + self.output_token_ids[: end - n]

    def append_token(self, token_id: int) -> None:
        out = self.output_token_ids
        out.append(token_id)
        # _check_stop inlined: this runs for every request every step.
        num_output = len(out)
        params = self.sampling_params
        if num_output >= self.max_tokens:
            # max_tokens is already capped at max_model_len: this bound beats min_tokens.
            self.status = RequestStatus.FINISHED_LENGTH
            if not params.ignore_eos and token_id in self.eos_token_ids:
                self.status = RequestStatus.FINISHED_STOPPED
            return
        if num_output < params.min_tokens:
            return
        if not params.ignore_eos and token_id in self.eos_token_ids:
            self.status = RequestStatus.FINISHED_STOPPED
        elif token_id in params.stop_token_ids:
            self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, token_id
