"""Synthetic step plans over a real runner's pool, for calibration (as
`benchmarks/gpu_path/bench_gpu_path.py` builds them): every request gets blocks of its own, decode
rows first, random token ids."""

from __future__ import annotations

import random

from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.kv.manager import cdiv
from kvtier.sampling_params import SamplingParams

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True, detokenize=False)


class PlanBuilder:
    def __init__(self, num_groups: int, block_size: int, num_blocks: int, vocab: int,
                 seed: int = 0):
        self.num_groups, self.block_size, self.num_blocks = num_groups, block_size, num_blocks
        self.vocab = vocab
        self.rng = random.Random(seed)
        self._next = 0
        self._serial = 0

    def reset(self) -> None:
        """Hand the pool out again from block 0 (the previous plans' rows must be gone)."""
        self._next = 0

    def fits(self, token_counts: list[int]) -> bool:
        need = sum(cdiv(n, self.block_size) for n in token_counts) * self.num_groups
        return self._next + need <= self.num_blocks

    def _blocks(self, tokens: int) -> tuple[tuple[int, ...], ...]:
        nb = cdiv(tokens, self.block_size)
        out = []
        for _ in range(self.num_groups):
            out.append(tuple(range(self._next, self._next + nb)))
            self._next += nb
        assert self._next <= self.num_blocks, "pool exhausted: check fits() first"
        return tuple(out)

    def _id(self, prefix: str) -> str:
        self._serial += 1
        return f"__calib_{prefix}{self._serial}"

    def _tokens(self, n: int) -> list[int]:
        return [self.rng.randrange(self.vocab) for _ in range(n)]

    def decode_rows(self, contexts: list[int]) -> tuple[list[ScheduledRequest], list[ScheduledRequest]]:
        """(rows that install the block tables, the same rows as a steady decode step)."""
        install: list[ScheduledRequest] = []
        steady: list[ScheduledRequest] = []
        nothing: tuple[tuple[int, ...], ...] = ((),) * self.num_groups
        for c in contexts:
            rid, tokens = self._id("d"), self._tokens(1)
            for blocks, reset, out in ((self._blocks(c), True, install), (nothing, False, steady)):
                out.append(ScheduledRequest(
                    request_id=rid, token_ids=tokens, start_pos=c - 1, new_block_ids=blocks,
                    reset_blocks=reset, sample=True, sampling_params=GREEDY,
                    num_output_tokens=1))
        return install, steady

    def prefill_rows(self, prefills: list[tuple[int, int]]) -> list[ScheduledRequest]:
        """Chunks of `new` tokens after `start` cached ones (the table is sent whole)."""
        return [ScheduledRequest(
            request_id=self._id("p"), token_ids=self._tokens(n), start_pos=s,
            new_block_ids=self._blocks(s + n), reset_blocks=True, sample=True,
            sampling_params=GREEDY, num_output_tokens=0) for n, s in prefills]


def finish_plan(rows: list[ScheduledRequest]) -> StepPlan:
    """A plan that only tells the runner to forget these rows' block tables."""
    return StepPlan(scheduled=[], finished_ids=[r.request_id for r in rows])
