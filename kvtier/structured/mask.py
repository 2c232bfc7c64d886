"""A step's packed allowed-token masks applied to its logits (torch): the sampler's side of
structured outputs. One op, the same on every device, so it is its own reference.

Words are unpacked a byte at a time through a 256-entry table of each byte's 8 bits
(little-endian words: byte k of word w holds tokens 32w + 8k ... 32w + 8k + 7, lowest bit
first): one gather instead of 32 shifts of every word, and the table holds the bits the mask
does not allow, so the fill needs no inverted copy (benchmarks/gpu_path/
bench_structured_overhead.py times it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
import torch


@functools.lru_cache(maxsize=8)
def _bit_table(device: torch.device, value: bool) -> torch.Tensor:
    """[256, 8] bool: whether bit j of byte b is `value`."""
    bits = (torch.arange(256).unsqueeze(1) >> torch.arange(8)) & 1
    return (bits == int(value)).to(device)


def _bits(words: torch.Tensor, vocab_size: int, value: bool) -> torch.Tensor:
    table = _bit_table(words.device, value)
    as_bytes = words.contiguous().view(torch.uint8).reshape(-1).to(torch.int32)
    return table.index_select(0, as_bytes).reshape(words.shape[0], -1)[:, :vocab_size]


def unpack(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 words -> [R, vocab_size] bool: the allowed tokens."""
    return _bits(words, vocab_size, True)


def mask_logits(logits: torch.Tensor, rows: list[int], masks: list[np.ndarray],
                put: Callable[[np.ndarray], torch.Tensor]) -> None:
    """Set to -inf, in place, the logits of row rows[i]'s tokens that masks[i] does not
    allow. `put` uploads a host array onto the logits' device (the runner's staging)."""
    refused = _bits(put(np.stack(masks)), logits.shape[1], False)
    if len(rows) == logits.shape[0] and rows == list(range(len(rows))):  # every row
        logits.masked_fill_(refused, float("-inf"))
        return
    idx = put(np.asarray(rows, dtype=np.int64))
    logits[idx] = logits[idx].masked_fill(refused, float("-inf"))
