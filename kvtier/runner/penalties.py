"""vLLM's logit adjustments beyond temperature and top-k/p, in vLLM's order: the logit bias,
then the repetition penalty (over the prompt's and the output's tokens: a positive logit
divided by it, a negative one multiplied), then the frequency penalty (times each token's
count in the output) and the presence penalty (once for each token the output holds).

The penalties read each row's token counts from `PenaltyView` (kvtier/runner/penalty_counts.py
keeps them on the device across steps); all penalized rows are adjusted at once, a handful of
kernels a step however many there are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import torch

from kvtier.sampling_params import SamplingParams

if TYPE_CHECKING:  # the sampler imports this module
    from kvtier.runner.sampler import Upload


class PenaltyRow(Protocol):
    params: SamplingParams


@dataclass(frozen=True)
class PenaltyView:
    """The step's penalized rows: their positions in the batch and their counts, and where
    those live (kvtier/runner/penalty_counts.py's pool rows, the requests)."""

    batch_rows: torch.Tensor  # [n] int64: the rows of the step's sampling batch
    output_counts: torch.Tensor  # [n, V] fp32: each token's count in the row's output
    in_prompt: torch.Tensor  # [n, V] bool: the tokens the row's prompt holds
    pool_rows: torch.Tensor  # [n] int64
    request_ids: list[str]


def adjusts_logits(params: SamplingParams) -> bool:
    return (params.penalized or bool(params.logit_bias)
            or params.allowed_token_ids is not None)


def apply_penalties(logits: torch.Tensor, rows: Sequence[PenaltyRow], put: Upload,
                    view: PenaltyView | None) -> None:
    """Adjusts `logits` ([B, V] fp32, one row per entry of `rows`) in place; `view`: the
    penalized rows' counts (None: no row is penalized)."""
    biased = [(i, r.params) for i, r in enumerate(rows) if r.params.logit_bias]
    if biased:
        _add_bias(logits, biased, put)
    if view is not None:
        _penalize(logits, [rows[i].params for i in view.batch_rows.tolist()], put, view)
    elif any(r.params.penalized for r in rows):
        raise RuntimeError("penalized rows need their token counts (PenaltyCounts.view)")


def _add_bias(logits: torch.Tensor, rows: list[tuple[int, SamplingParams]], put: Upload) -> None:
    vocab = logits.shape[1]
    at = [(i, t, b) for i, p in rows for t, b in p.logit_bias if t < vocab]
    if not at:
        return
    flat = np.asarray(at, dtype=np.float64)
    idx = (put(flat[:, 0].astype(np.int64)), put(flat[:, 1].astype(np.int64)))
    logits.index_put_(idx, put(flat[:, 2].astype(np.float32)), accumulate=True)


def _penalize(logits: torch.Tensor, params: list[SamplingParams], put: Upload,
              view: PenaltyView) -> None:
    counts, idx = view.output_counts, view.batch_rows
    seen = counts > 0
    sub = logits[idx]
    if any(p.repetition_penalty != 1.0 for p in params):
        rep = _column([p.repetition_penalty for p in params], put)
        sub = torch.where(seen | view.in_prompt, torch.where(sub > 0, sub / rep, sub * rep),
                          sub)
    sub = sub - _column([p.frequency_penalty for p in params], put) * counts
    sub = sub - _column([p.presence_penalty for p in params], put) * seen
    logits[idx] = sub


def _column(values: list[float], put: Upload) -> torch.Tensor:
    return put(np.asarray(values, dtype=np.float32)).unsqueeze(1)
