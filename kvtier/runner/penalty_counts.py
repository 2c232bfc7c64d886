"""The token counts vLLM's penalties read (kvtier/runner/penalties.py), kept on the logits'
device across steps: per penalized request one row of two pooled tensors, its output tokens'
counts and the tokens its prompt holds.

A request's row is built from its token lists (ScheduledRequest.history) when it first
samples, and again after a preemption dropped it; from then on each step adds the token it
sampled, on the device, in stream order: under async scheduling the next step is planned
before that token reaches the host, and its penalties still count it, with no read-back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from kvtier.runner.penalties import PenaltyView
from kvtier.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvtier.runner.sampler import Upload

INITIAL_ROWS = 8  # the pool doubles as penalized requests come


class CountedRow(Protocol):
    params: SamplingParams
    num_output_tokens: int
    history: tuple[list[int], list[int]] | None  # (prompt ids, output ids)


class PenaltyCounts:
    def __init__(self) -> None:
        self.output_counts: torch.Tensor | None = None  # [capacity, V] fp32
        self.in_prompt: torch.Tensor | None = None  # [capacity, V] bool
        self.row_of: dict[str, int] = {}
        self.counted: dict[str, int] = {}  # output tokens in each row's counts
        self._free: list[int] = []

    def view(self, ids: Sequence[str], rows: Sequence[CountedRow], logits: torch.Tensor,
             put: Upload) -> PenaltyView | None:
        """The step's penalized rows with their counts (None if it has none)."""
        batch, pool, penalized = [], [], []
        for i, (rid, row) in enumerate(zip(ids, rows)):
            if row.params.penalized:
                batch.append(i)
                pool.append(self._row(rid, row, logits, put))
                penalized.append(rid)
        if not batch:
            return None
        assert self.output_counts is not None and self.in_prompt is not None
        at = put(np.asarray(pool, dtype=np.int64))
        return PenaltyView(put(np.asarray(batch, dtype=np.int64)), self.output_counts[at],
                           self.in_prompt[at], at, penalized)

    def record(self, viewed: PenaltyView | None, tokens: torch.Tensor) -> None:
        """The step's sampled tokens ([B] int64 on the device) into their rows' counts."""
        if viewed is None:
            return
        at = viewed.pool_rows
        assert self.output_counts is not None
        self.output_counts.index_put_((at, tokens[viewed.batch_rows]),
                                      self.output_counts.new_ones(()).expand(at.shape[0]),
                                      accumulate=True)
        for rid in viewed.request_ids:
            self.counted[rid] += 1

    def forget(self, request_id: str) -> None:
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self._free.append(row)
            del self.counted[request_id]

    def _row(self, rid: str, row: CountedRow, logits: torch.Tensor, put: Upload) -> int:
        """The request's pool row, (re)built from its token lists unless its counts already
        hold its outputs so far."""
        n = row.num_output_tokens
        if self.counted.get(rid) == n:
            return self.row_of[rid]
        if row.history is None or len(row.history[1]) < n:
            raise RuntimeError(f"{rid}: its {n} output tokens are needed to count them")
        prompt, outputs = row.history
        r = self.row_of.get(rid)
        if r is None:
            r = self.row_of[rid] = self._take(logits)
        assert self.output_counts is not None and self.in_prompt is not None
        counts, mask = self.output_counts[r], self.in_prompt[r]
        counts.zero_()
        mask.zero_()
        vocab = logits.shape[1]
        out = np.asarray(outputs[:n], dtype=np.int64)
        if len(out):
            counts.index_put_((put(out[out < vocab]),), counts.new_ones(()), accumulate=True)
        ids = np.unique(np.asarray(prompt, dtype=np.int64))
        mask[put(ids[ids < vocab])] = True
        self.counted[rid] = n
        return r

    def _take(self, logits: torch.Tensor) -> int:
        if not self._free:
            self._grow(logits)
        return self._free.pop()

    def _grow(self, logits: torch.Tensor) -> None:
        vocab, have = logits.shape[1], 0 if self.output_counts is None else len(self.output_counts)
        more = max(INITIAL_ROWS, have)
        counts = logits.new_zeros((more, vocab), dtype=torch.float32)
        mask = torch.zeros((more, vocab), dtype=torch.bool, device=logits.device)
        if self.output_counts is not None and self.in_prompt is not None:
            counts = torch.cat([self.output_counts, counts])
            mask = torch.cat([self.in_prompt, mask])
        self.output_counts, self.in_prompt = counts, mask
        self._free.extend(range(have + more - 1, have - 1, -1))
