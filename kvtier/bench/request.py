"""What a workload is made of: requests with token ids, an output length and an arrival offset."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Protocol


class Tokenizer(Protocol):
    """The one method a workload loader needs (the engine's tokenizer has it)."""

    def encode(self, text: str) -> list[int]: ...


@dataclass(frozen=True)
class BenchRequest:
    """One request of a workload, independent of the engine that will serve it.

    `arrival_s` is the offset from the start of the run at which the request is sent; the
    runner turns it into an absolute arrival time, so queueing delay counts in TTFT.

    A follow-up (`follows` = the workload index of an earlier request, e.g. the previous
    turn of a conversation) is closed-loop: it is sent `think_s` after that request ended,
    and not before `arrival_s` (its conversation's start).
    """

    prompt_token_ids: tuple[int, ...]
    output_len: int
    arrival_s: float = 0.0
    follows: int | None = None
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_token_ids, tuple):
            object.__setattr__(self, "prompt_token_ids", tuple(self.prompt_token_ids))
        if not self.prompt_token_ids:
            raise ValueError("a request needs at least one prompt token")
        if self.output_len < 1:
            raise ValueError(f"output_len must be >= 1, got {self.output_len}")
        if self.arrival_s < 0:
            raise ValueError(f"arrival_s must be >= 0, got {self.arrival_s}")
        if self.follows is not None and self.follows < 0:
            raise ValueError(f"follows must be a request index >= 0, got {self.follows}")
        if self.think_s < 0:
            raise ValueError(f"think_s must be >= 0, got {self.think_s}")

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_token_ids)


@dataclass(frozen=True)
class LengthLimits:
    """Which (prompt, output) lengths a workload keeps.

    The defaults are vLLM's benchmark_serving `sample_sharegpt_requests`: drop prompts or
    outputs shorter than 4 tokens (too little to measure), prompts over 1024 tokens and
    prompt + output over 2048 tokens. `None` lifts a maximum.
    """

    min_prompt_len: int = 4
    min_output_len: int = 4
    max_prompt_len: int | None = 1024
    max_total_len: int | None = 2048

    def accepts(self, prompt_len: int, output_len: int) -> bool:
        return self.rejection(prompt_len, output_len) is None

    def rejection(self, prompt_len: int, output_len: int) -> str | None:
        """Which bound drops these lengths, named by the option that sets it; None: kept.

        A request needs one prompt token and one output token whatever the minimums say
        (an empty prompt or reply is dropped, not a request the engine cannot take)."""
        if prompt_len < max(self.min_prompt_len, 1):
            return f"prompt < {max(self.min_prompt_len, 1)} tokens (--min-prompt-len)"
        if output_len < max(self.min_output_len, 1):
            return f"output < {max(self.min_output_len, 1)} tokens (--min-output-len)"
        if self.max_prompt_len is not None and prompt_len > self.max_prompt_len:
            return f"prompt > {self.max_prompt_len} tokens (--max-prompt-len, --max-model-len)"
        if self.max_total_len is not None and prompt_len + output_len > self.max_total_len:
            return (f"prompt + output > {self.max_total_len} tokens (--max-total-len, "
                    "--max-model-len)")
        return None

    def clip(self, prompt_len: int, output_len: int) -> tuple[int, int]:
        """Lengths forced inside the limits: for traces, where dropping would change the rate."""
        prompt = max(prompt_len, self.min_prompt_len, 1)
        if self.max_prompt_len is not None:
            prompt = min(prompt, self.max_prompt_len)
        if self.max_total_len is not None:
            prompt = min(prompt, self.max_total_len - max(self.min_output_len, 1))
        output = max(output_len, self.min_output_len, 1)
        if self.max_total_len is not None:
            output = min(output, self.max_total_len - prompt)
        return prompt, output


# A trace's or a prepared file's lengths are the workload: no filter beyond what a request
# must have (one prompt token, one output token) and what the model can hold.
AS_GIVEN = LengthLimits(min_prompt_len=1, min_output_len=1, max_prompt_len=None, max_total_len=None)


class OutsideAction(str, enum.Enum):
    """What a workload does with a request outside its length limits."""

    DROPPED = "dropped"  # the next one is taken instead
    TRUNCATED = "truncated"  # kept with its lengths clipped, so a trace keeps its arrivals


@dataclass(frozen=True)
class LengthReport:
    """The requests of the source that fell outside the limits, and what was done to them."""

    limits: LengthLimits
    num_outside: int
    action: OutsideAction

    def describe(self) -> str:
        lim = self.limits
        return (f"{self.num_outside} requests outside prompt <= {lim.max_prompt_len}, "
                f"prompt + output <= {lim.max_total_len} (minimums {lim.min_prompt_len} / "
                f"{lim.min_output_len}): {self.action.value}")


def describe_rejections(reasons: dict[str, int]) -> str:
    """`reasons` (a count per `LengthLimits.rejection`), most frequent first, for the
    message that says why fewer requests than asked for fit."""
    if not reasons:
        return "none dropped by the length limits"
    ranked = sorted(reasons.items(), key=lambda kv: -kv[1])
    return "dropped: " + ", ".join(f"{n} with {why}" for why, n in ranked)
