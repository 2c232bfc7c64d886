"""Token sampling: greedy, temperature, top-k, top-p, min-p, seeds, min_tokens, logprobs,
grammar masks (structured outputs), logit bias and vLLM's penalties (kvtier/runner/penalties.py; logprobs are those of the
logits before them).

Seeded requests draw from a generator seeded by (seed, output index), so a seeded request
samples the same tokens whatever the batch, the step boundaries or the preemptions.
Unseeded requests share one batched draw: the exponential-race trick picks a token with
probability p_i without torch.multinomial's per-row launches (and without a host sync).

`sample_on_device` leaves the tokens on the device and reads nothing back; the runner takes
it for every batch that asks for no logprobs, so a sampled step reads its tokens back the way
a greedy one does (pinned, after an event). Its few per-row values (temperatures, row and
banned-id indices) go up by `upload` (the runner's pinned staging): a pageable upload is a
copy-engine transfer, which queues behind other streams' host-tier copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvtier.core.plan import ScheduledRequest
from kvtier.runner.penalties import PenaltyView, adjusts_logits, apply_penalties
from kvtier.sampling_params import SamplingParams
from kvtier.structured.mask import mask_logits

Upload = Callable[[np.ndarray], torch.Tensor]  # a host array onto the logits' device


@dataclass(slots=True)  # not frozen: built for every sampling request every step
class SampleRow:
    params: SamplingParams
    num_output_tokens: int  # tokens generated before this one
    banned_ids: tuple[int, ...]  # eos/stop ids while min_tokens is not reached, bad words
    # Penalized rows: (prompt ids, output ids), the request's lists (under async scheduling
    # the output list may lack the token in flight; kvtier/runner/penalty_counts.py).
    history: tuple[list[int], list[int]] | None = None
    # Structured outputs: the packed allowed-token mask (ScheduledRequest.token_mask; the
    # row's min_tokens bans are in it, so its logprobs have them too; banned_ids then holds
    # only its bad words).
    allowed: np.ndarray | None = None


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]

    def logprobs_by_id(self, ids: list[str]) -> dict[str, dict[int, float]]:
        """The logprobs of the rows that asked for them, by request id."""
        if self.logprobs.count(None) == len(ids):
            return {}
        return {i: lp for i, lp in zip(ids, self.logprobs) if lp is not None}


def sample_row(eos_token_ids: Sequence[int], sr: ScheduledRequest) -> SampleRow:
    """A sampling request's row: eos and stop ids banned until min_tokens, a penalized
    row's token lists."""
    p = sr.sampling_params
    num_output = sr.num_output_tokens
    history, words = sr.history, sr.banned_ids
    if sr.token_mask is not None:
        return SampleRow(p, num_output, words, history, sr.token_mask)
    if num_output >= p.min_tokens:  # the common case: nothing banned but bad words
        return SampleRow(p, num_output, words, history)
    eos = () if p.ignore_eos else tuple(eos_token_ids)
    return SampleRow(p, num_output, eos + tuple(p.stop_token_ids) + words, history)


def sample(logits: torch.Tensor, rows: list[SampleRow], upload: Upload | None = None,
           penalties: PenaltyView | None = None) -> Sampled:
    """logits: [B, V] in the model's dtype, one row per SampleRow. Reads the tokens (and the
    logprobs asked for) back to the host. `penalties`: the penalized rows' counts."""
    if plain_greedy(rows):
        # The common benchmark/greedy batch: one argmax (exact in any dtype), one device->host
        # copy.
        return Sampled(logits.argmax(dim=-1).tolist(), [None] * len(rows))
    put = upload or _pageable_upload(logits.device)
    logits = _masked(logits, rows, put)
    # vLLM's logprobs: after a grammar's mask, before the bans and adjustments.
    logprobs_all = torch.log_softmax(logits, dim=-1) if wants_logprobs(rows) else None
    _ban(logits, rows, put)
    apply_penalties(logits, rows, put, penalties)
    token_list = _draw_tokens(logits, rows, put).tolist()
    out_logprobs: list[dict[int, float] | None] = []
    for i, row in enumerate(rows):
        k = row.params.logprobs
        if k is None or logprobs_all is None:
            out_logprobs.append(None)
            continue
        entry = {token_list[i]: float(logprobs_all[i, token_list[i]])}
        if k > 0:
            top = logprobs_all[i].topk(k)
            entry.update(zip(top.indices.tolist(), top.values.tolist()))
        out_logprobs.append(entry)
    return Sampled(token_list, out_logprobs)


def sample_on_device(logits: torch.Tensor, rows: list[SampleRow],
                     upload: Upload | None = None,
                     penalties: PenaltyView | None = None) -> torch.Tensor:
    """The tokens `sample` draws, as [B] int64 on the logits' device, without a host sync
    (logprobs are not computed: `wants_logprobs` says when they must be)."""
    put = upload or _pageable_upload(logits.device)
    logits = _masked(logits, rows, put)
    _ban(logits, rows, put)
    apply_penalties(logits, rows, put, penalties)
    return _draw_tokens(logits, rows, put)


def wants_logprobs(rows: list[SampleRow]) -> bool:
    return any(r.params.logprobs is not None for r in rows)


def _pageable_upload(device: torch.device) -> Upload:
    return lambda a: torch.from_numpy(a).to(device)


def _masked(logits: torch.Tensor, rows: list[SampleRow], put: Upload) -> torch.Tensor:
    """The fp32 copy of the logits (softmax, temperature, logprobs: fp32) with the tokens
    each row's grammar does not allow (structured outputs) at -inf."""
    # Always a copy (bf16 logits need one anyway): the bans and penalties write into it.
    logits = logits.to(torch.float32, copy=True)
    masks = [(i, row.allowed) for i, row in enumerate(rows) if row.allowed is not None]
    if masks:
        mask_logits(logits, [i for i, _ in masks], [m for _, m in masks], put)
    return logits


def _ban(logits: torch.Tensor, rows: list[SampleRow], put: Upload) -> None:
    """Each row's banned ids (eos/stop while min_tokens is not reached, bad words) and the
    ids outside its allowed_token_ids at -inf, in place."""
    pairs = [(i, t) for i, row in enumerate(rows) for t in row.banned_ids]
    if pairs:
        at = np.asarray(pairs, dtype=np.int64)
        # the value made on the device: torch.tensor(-inf, device=...) would be an upload
        logits.index_put_((put(at[:, 0]), put(at[:, 1])), logits.new_full((), float("-inf")))
    only = [(i, ids) for i, row in enumerate(rows)
            if (ids := row.params.allowed_token_ids) is not None]
    if only:
        _keep_only(logits, only, put)


def _keep_only(logits: torch.Tensor, rows: list[tuple[int, tuple[int, ...]]],
               put: Upload) -> None:
    """vLLM's allowed_token_ids: each row's logits at -inf but for its ids (kept as they
    were, bans included)."""
    vocab = logits.shape[1]
    at = np.asarray([(i, t) for i, ids in rows for t in ids if t < vocab],
                    dtype=np.int64).reshape(-1, 2)
    kept = (put(at[:, 0]), put(at[:, 1]))
    values = logits[kept]
    logits.index_fill_(0, put(np.asarray([i for i, _ in rows], dtype=np.int64)), float("-inf"))
    logits.index_put_(kept, values)


def _draw_tokens(logits: torch.Tensor, rows: list[SampleRow], put: Upload) -> torch.Tensor:
    """Greedy rows' argmax, the other rows drawn from their filtered distribution."""
    tokens = logits.argmax(dim=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.params.greedy]
    if not random_idx:
        return tokens
    params = [rows[i].params for i in random_idx]
    if len(random_idx) == len(rows):  # the common sampled batch: no gather, no scatter
        return _draw(_filtered_probs(logits, params, put), rows)
    idx = put(np.asarray(random_idx, dtype=np.int64))
    tokens[idx] = _draw(_filtered_probs(logits[idx], params, put),
                        [rows[i] for i in random_idx])
    return tokens


def plain_greedy(rows: list[SampleRow]) -> bool:
    """Every row greedy, without logprobs or banned ids. The rows of a batch mostly share
    one SamplingParams object: each distinct one in a run is checked once."""
    last = None
    for r in rows:
        if r.banned_ids or r.allowed is not None:
            return False
        p = r.params
        if p is not last:
            if not p.greedy or p.logprobs is not None or adjusts_logits(p):
                return False
            last = p
    return True


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams],
                    put: Upload) -> torch.Tensor:
    # A tensor of temperatures, never a Python scalar: a CUDA division by a scalar may
    # multiply by its reciprocal, and a seeded row must draw the same whatever its batch.
    temps = put(np.asarray([p.temperature for p in params], dtype=np.float32))
    logits = logits / temps.unsqueeze(1)
    for i, p in enumerate(params):
        if 0 < p.top_k < logits.shape[1]:
            row = logits[i]
            row.masked_fill_(row < row.topk(p.top_k).values[-1], float("-inf"))
        if p.top_p < 1.0:
            logits[i] = _top_p(logits[i], p.top_p)
    probs = torch.softmax(logits, dim=-1)
    for i, p in enumerate(params):
        if p.min_p > 0.0:  # vLLM's order: after temperature, top-k and top-p
            row = probs[i]  # the race below needs no renormalising
            row.masked_fill_(row < p.min_p * row.max(), 0.0)
    return probs


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
    drop = (cum - sorted_logits.softmax(-1)) >= top_p
    sorted_logits.masked_fill_(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(0, order, sorted_logits)


def _draw(probs: torch.Tensor, rows: list[SampleRow]) -> torch.Tensor:
    noise = torch.empty_like(probs).exponential_()
    for i, row in enumerate(rows):
        seed = row.params.seed
        if seed is not None:
            gen = torch.Generator(device=probs.device)
            gen.manual_seed((seed * 1_000_003 + row.num_output_tokens) % (2**63))
            noise[i].exponential_(generator=gen)
    return (probs / noise).argmax(dim=-1)
