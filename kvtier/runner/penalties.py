"""vLLM's logit adjustments that read a request's earlier tokens, in vLLM's order: the logit
bias, then the repetition penalty (over the prompt's and the output's tokens: a positive logit
divided by it, a negative one multiplied), then the frequency penalty (times each token's
count in the output) and the presence penalty (once for each token the output holds).

Only the rows that ask for any are touched, all of them at once: a count matrix over those
rows is built on the device from their token lists, so a step with many penalized rows costs
a handful of kernels, not a few per row.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch

from kvtier.sampling_params import SamplingParams

Upload = Callable[[np.ndarray], torch.Tensor]


class PenaltyRow(Protocol):
    params: SamplingParams
    history: tuple[list[int], list[int]] | None  # (prompt ids, output ids)


class InFlightTokens:
    """The last token sampled for each penalized request. Under async scheduling a step is
    planned before the token of the step in flight reaches the request's output list; the
    runner reads penalized rows' tokens back at once and keeps them here for that step."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def record(self, ids: Sequence[str], rows: Sequence[PenaltyRow],
               tokens: Sequence[int]) -> None:
        self._last.update((i, t) for i, r, t in zip(ids, rows, tokens) if r.history is not None)

    def forget(self, request_id: str) -> None:
        self._last.pop(request_id, None)

    def history(self, request_id: str, history: tuple[list[int], list[int]] | None,
                num_output_tokens: int) -> tuple[list[int], list[int]] | None:
        """The prompt and the `num_output_tokens` outputs before this row's token (None for
        a row that is not penalized)."""
        if history is None:
            return None
        prompt, outputs = history
        known = list(outputs[:num_output_tokens])
        if len(known) == num_output_tokens - 1 and request_id in self._last:
            known.append(self._last[request_id])
        if len(known) != num_output_tokens:
            raise RuntimeError(f"{request_id}: {num_output_tokens} output tokens, "
                               f"{len(known)} known")
        return prompt, known


def adjusts_logits(params: SamplingParams) -> bool:
    return params.penalized or bool(params.logit_bias)


def apply_penalties(logits: torch.Tensor, rows: Sequence[PenaltyRow], put: Upload) -> None:
    """Adjusts `logits` ([B, V] fp32, one row per entry of `rows`) in place."""
    biased = [i for i, r in enumerate(rows) if r.params.logit_bias]
    if biased:
        _add_bias(logits, [(i, rows[i].params) for i in biased], put)
    penalized = [i for i, r in enumerate(rows) if r.params.penalized]
    if penalized:
        _penalize(logits, [(i, rows[i]) for i in penalized], put)


def _add_bias(logits: torch.Tensor, rows: list[tuple[int, SamplingParams]], put: Upload) -> None:
    vocab = logits.shape[1]
    at = [(i, t, b) for i, p in rows for t, b in p.logit_bias if t < vocab]
    if not at:
        return
    flat = np.asarray(at, dtype=np.float64)
    idx = (put(flat[:, 0].astype(np.int64)), put(flat[:, 1].astype(np.int64)))
    logits.index_put_(idx, put(flat[:, 2].astype(np.float32)), accumulate=True)


def _penalize(logits: torch.Tensor, rows: list[tuple[int, PenaltyRow]], put: Upload) -> None:
    n, vocab = len(rows), logits.shape[1]
    params = [r.params for _, r in rows]
    counts = _counts(n, vocab, [_history(r)[1] for _, r in rows], logits, put)
    seen = counts > 0
    idx = put(np.asarray([i for i, _ in rows], dtype=np.int64))
    sub = logits[idx]
    if any(p.repetition_penalty != 1.0 for p in params):
        prompt = _counts(n, vocab, [_history(r)[0] for _, r in rows], logits, put)
        rep = _column([p.repetition_penalty for p in params], put)
        sub = torch.where(seen | (prompt > 0), torch.where(sub > 0, sub / rep, sub * rep), sub)
    sub = sub - _column([p.frequency_penalty for p in params], put) * counts
    sub = sub - _column([p.presence_penalty for p in params], put) * seen
    logits[idx] = sub


def _history(row: PenaltyRow) -> tuple[Sequence[int], Sequence[int]]:
    if row.history is None:
        raise RuntimeError("a penalized row needs its request's tokens (ScheduledRequest.history)")
    return row.history


def _counts(n: int, vocab: int, lists: list[Sequence[int]], like: torch.Tensor,
            put: Upload) -> torch.Tensor:
    """[n, vocab] fp32: how often each token stands in each row's list."""
    counts = like.new_zeros((n, vocab))
    lengths = [len(x) for x in lists]
    if not sum(lengths):
        return counts
    tokens = np.fromiter((t for x in lists for t in x), dtype=np.int64, count=sum(lengths))
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    keep = tokens < vocab
    counts.index_put_((put(row[keep]), put(tokens[keep])),
                      like.new_ones(()).expand(int(keep.sum())), accumulate=True)
    return counts


def _column(values: list[float], put: Upload) -> torch.Tensor:
    return put(np.asarray(values, dtype=np.float32)).unsqueeze(1)
