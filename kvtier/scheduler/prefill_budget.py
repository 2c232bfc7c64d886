"""How many prompt tokens a request computes in one step: vLLM's long-prefill controls.

Every running decode waits for the whole step, and a step's time grows with the prefill
tokens in it; so a long prompt's chunk is capped (`long_prefill_token_threshold`), and the
tokens a step leaves free go to decodes and to other prompts, of which at most
`max_num_partial_prefills` may stop part-way in one step (so capped chunks do not fill the
budget with many long prompts at once and slow every one of them down).

    remaining tokens of a request ──► min(budget left, threshold) ──► partial? ──► count
                                                                    (limit hit: 0 now)

Without a threshold, only the step's last prefill is ever cut (by the budget, which it then
exhausts): at most one partial prefill per step, the behaviour before these controls.
"""

from __future__ import annotations

from kvtier.config import SchedulerConfig


class PrefillChunker:
    """One step's prefill chunks; `chunk` counts the partial prefills it hands out.

    A request is a prefill here when it has more than one uncomputed token (a prompt, or
    tokens to recompute after preemption); a decode (one token) is never capped.
    """

    __slots__ = ("threshold", "max_partial", "num_partial")

    def __init__(self, threshold: int, max_partial: int):
        self.threshold = threshold  # 0: no cap
        self.max_partial = max_partial
        self.num_partial = 0

    @classmethod
    def for_step(cls, config: SchedulerConfig) -> PrefillChunker:
        return cls(config.effective_long_prefill_threshold, config.max_num_partial_prefills)

    def chunk(self, num_remaining: int, num_fit: int) -> int:
        """Tokens to compute now for a request with `num_remaining` uncomputed tokens, of
        which `num_fit` fit the step's token budget: all that fit, at most the threshold;
        0 when that would leave it partial and the step already has its partial prefills."""
        n = num_fit if num_fit < num_remaining else num_remaining
        if 0 < self.threshold < n:
            n = self.threshold
        if n < num_remaining:
            if self.num_partial >= self.max_partial:
                return 0
            self.num_partial += 1
        return n

    def give_back(self, n: int, num_remaining: int) -> None:
        """A chunk `chunk` handed out was not scheduled after all (no room for it, or its
        request was taken back): if it was a partial prefill, its place is free again."""
        if n < num_remaining:
            self.num_partial -= 1
