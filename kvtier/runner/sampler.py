"""Token sampling: greedy, temperature, top-k, top-p, min-p, seeds, min_tokens, logprobs.

Seeded requests draw from a generator seeded by (seed, output index), so a seeded request
samples the same tokens whatever the batch, the step boundaries or the preemptions.
Unseeded requests share one batched draw: the exponential-race trick picks a token with
probability p_i without torch.multinomial's per-row launches (and without a host sync).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvtier.sampling_params import SamplingParams


@dataclass(slots=True)  # not frozen: built for every sampling request every step
class SampleRow:
    params: SamplingParams
    num_output_tokens: int  # tokens generated before this one
    banned_ids: tuple[int, ...]  # eos/stop ids while min_tokens is not reached


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None]


def sample(logits: torch.Tensor, rows: list[SampleRow]) -> Sampled:
    """logits: [B, V] in the model's dtype, one row per SampleRow."""
    if plain_greedy(rows):
        # The common benchmark/greedy batch: one argmax (exact in any dtype), one device->host
        # copy.
        return Sampled(logits.argmax(dim=-1).tolist(), [None] * len(rows))
    logits = logits.float()  # softmax, temperature, logprobs: fp32 (a copy unless already)
    for i, row in enumerate(rows):
        if row.banned_ids:
            logits[i, list(row.banned_ids)] = float("-inf")
    want_logprobs = any(r.params.logprobs is not None for r in rows)
    logprobs_all = torch.log_softmax(logits, dim=-1) if want_logprobs else None

    tokens = logits.argmax(dim=-1)
    random_idx = [i for i, r in enumerate(rows) if not r.params.greedy]
    if random_idx:
        idx = torch.tensor(random_idx, device=logits.device)
        probs = _filtered_probs(logits[idx], [rows[i].params for i in random_idx])
        tokens[idx] = _draw(probs, [rows[i] for i in random_idx])

    token_list = tokens.tolist()
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


def plain_greedy(rows: list[SampleRow]) -> bool:
    """Every row greedy, without logprobs or banned ids. The rows of a batch mostly share
    one SamplingParams object: each distinct one in a run is checked once."""
    last = None
    for r in rows:
        if r.banned_ids:
            return False
        p = r.params
        if p is not last:
            if not p.greedy or p.logprobs is not None:
                return False
            last = p
    return True


def _filtered_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    temps = torch.tensor([p.temperature for p in params], device=logits.device)
    logits = logits / temps.unsqueeze(1)
    for i, p in enumerate(params):
        if 0 < p.top_k < logits.shape[1]:
            kth = logits[i].topk(p.top_k).values[-1]
            logits[i][logits[i] < kth] = float("-inf")
        if p.top_p < 1.0:
            logits[i] = _top_p(logits[i], p.top_p)
    probs = torch.softmax(logits, dim=-1)
    for i, p in enumerate(params):
        if p.min_p > 0.0:  # vLLM's order: after temperature, top-k and top-p
            row = probs[i]
            row[row < p.min_p * row.max()] = 0.0  # the race below needs no renormalising
    return probs


def _top_p(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, order = logits.sort(descending=True)
    cum = sorted_logits.softmax(-1).cumsum(-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token is always kept).
    drop = (cum - sorted_logits.softmax(-1)) >= top_p
    sorted_logits[drop] = float("-inf")
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
