"""A step's packed allowed-token masks applied to its logits (torch): the sampler's side of
structured outputs. One op, the same on every device, so it is its own reference."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch


def unpack(words: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[R, W] int32 words -> [R, vocab_size] bool, token t at bit t % 32 of word t // 32."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1  # an arithmetic shift: bit 31 reads the same
    return bits.reshape(words.shape[0], -1)[:, :vocab_size].bool()


def mask_logits(logits: torch.Tensor, rows: list[int], masks: list[np.ndarray],
                put: Callable[[np.ndarray], torch.Tensor]) -> None:
    """Set to -inf, in place, the logits of row rows[i]'s tokens that masks[i] does not
    allow. `put` uploads a host array onto the logits' device (the runner's staging)."""
    allowed = unpack(put(np.stack(masks)), logits.shape[1])
    idx = put(np.asarray(rows, dtype=np.int64))
    logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))
