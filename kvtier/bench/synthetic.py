"""Prompts of random token ids with given lengths (vLLM's "random" dataset, trace lengths)."""

from __future__ import annotations

import numpy as np

from kvtier.bench.request import BenchRequest

# Ids below this are left out: tokenizers keep their control and byte tokens there, and a
# random prompt should look like text to the model, not like a stream of special tokens.
_FIRST_ID = 16


def random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> tuple[int, ...]:
    low = _FIRST_ID if vocab_size > 2 * _FIRST_ID else 0
    return tuple(int(t) for t in rng.integers(low, vocab_size, size=length))


def requests_with_lengths(
    lengths: list[tuple[int, int]], vocab_size: int, seed: int
) -> list[BenchRequest]:
    """One request of random prompt tokens per (prompt_len, output_len), arrival 0."""
    rng = np.random.default_rng(seed)
    return [BenchRequest(random_prompt(rng, p, vocab_size), o) for p, o in lengths]


def synthetic_lengths(
    num_requests: int, input_len: int, output_len: int, range_ratio: float, seed: int
) -> list[tuple[int, int]]:
    """Lengths uniform in [len * (1 - range_ratio), len * (1 + range_ratio)], like vLLM's."""
    if not 0.0 <= range_ratio < 1.0:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
    rng = np.random.default_rng(seed)

    def draw(mean: int) -> np.ndarray:
        lo = max(1, int(mean * (1 - range_ratio)))
        hi = max(lo, int(mean * (1 + range_ratio)))
        return rng.integers(lo, hi + 1, size=num_requests)

    prompts, outputs = draw(input_len), draw(output_len)
    return [(int(p), int(o)) for p, o in zip(prompts, outputs)]
