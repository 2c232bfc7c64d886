"""vLLM's prompt logprobs (`SamplingParams(prompt_logprobs=k)`): for each prompt token after
the first, its logprob under the logits of the position before it, and the k likeliest
tokens there. A prompt chunk's rows already compute those logits' hidden states; the runner
keeps them past the last layer beside the sampling rows' (`prompt_rows`), and scores them
here, a slice of rows at a time (a long chunk's [rows, vocab] in fp32 would not fit at once).

The scheduler hands such a chunk its request's prompt (ScheduledRequest.prompt_ids): the
target of a chunk's last row is the next chunk's first token. The prefix cache does not
serve these requests (kvtier/kv/prefix_cache.py), as in vLLM: a cached token has no logits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

import numpy as np
import torch

from kvtier.core.plan import ScheduledRequest
from kvtier.runner.sampler import Upload

PromptLogprobs = dict[str, list[tuple[int, dict[int, float]]]]  # id -> (position, logprobs)
SLICE_ROWS = 512  # rows scored at once
_prompt_ids = attrgetter("prompt_ids")


@dataclass(frozen=True)
class PromptRows:
    token_idx: np.ndarray  # [R] int64: the batch tokens whose logits score a prompt token
    targets: np.ndarray  # [R] int64: the prompt token each one scores
    owners: tuple[tuple[str, int, int, int], ...]  # (request id, k, first target pos, rows)


def prompt_rows(scheduled: Sequence[ScheduledRequest],
                query_start_loc: np.ndarray) -> PromptRows | None:
    """The step's rows that score prompt tokens (batch row i is scheduled[i]), or None."""
    idx, targets, owners = [], [], []
    for i, sr in enumerate(scheduled):
        prompt = sr.prompt_ids
        if prompt is None:
            continue
        k = sr.sampling_params.prompt_logprobs
        end = min(sr.seq_len, len(prompt) - 1)  # a row at position p scores token p + 1
        if k is None or end <= sr.start_pos:
            continue
        first = int(query_start_loc[i])
        idx.append(np.arange(first, first + end - sr.start_pos, dtype=np.int64))
        targets.append(np.asarray(prompt[sr.start_pos + 1:end + 1], dtype=np.int64))
        owners.append((sr.request_id, k, sr.start_pos + 1, end - sr.start_pos))
    if not owners:
        return None
    return PromptRows(np.concatenate(idx), np.concatenate(targets), tuple(owners))


def score(logits: torch.Tensor, rows: PromptRows, put: Upload) -> PromptLogprobs:
    """`logits`: [R, V] of `rows.token_idx`, in order. Each row's target logprob and its
    owner's top k, read back to the host."""
    targets = put(rows.targets)
    top_k = max(k for _, k, _, _ in rows.owners)
    chosen, top_vals, top_ids = [], [], []
    for start in range(0, logits.shape[0], SLICE_ROWS):
        part = torch.log_softmax(logits[start:start + SLICE_ROWS].float(), dim=-1)
        chosen.append(part.gather(1, targets[start:start + SLICE_ROWS, None])[:, 0])
        if top_k:
            top = part.topk(top_k, dim=-1)
            top_vals.append(top.values)
            top_ids.append(top.indices)
    lp = torch.cat(chosen).tolist()
    vals = torch.cat(top_vals).tolist() if top_k else None
    ids = torch.cat(top_ids).tolist() if top_k else None
    out: PromptLogprobs = {}
    row = 0
    for rid, k, first, count in rows.owners:
        entries = []
        for j in range(row, row + count):
            entry = {int(rows.targets[j]): lp[j]}
            if k and vals is not None and ids is not None:
                entry.update(zip(ids[j][:k], vals[j][:k]))
            entries.append((first + j - row, entry))
        out[rid] = entries
        row += count
    return out


def forward_scored(runner: Any, scheduled: list[ScheduledRequest], batch: Any,
                   external: Any) -> tuple[torch.Tensor | None, PromptLogprobs]:
    """The runner's forward: the sampling rows' logits, and the prompt logprobs the step's
    chunks score (decode-only steps have none: the common step pays one check)."""
    scored = (None if batch.is_decode_only or not any(map(_prompt_ids, scheduled))
              else prompt_rows(scheduled, batch.query_start_loc))
    if scored is None:
        return runner.forward_logits(batch, external), {}
    logits = runner.forward_logits(batch, external, scored.token_idx)
    assert logits is not None
    n = len(batch.logits_idx)
    return (logits[:n] if n else None), score(logits[n:], scored, runner.staging.put)
