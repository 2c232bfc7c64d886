"""The attention warm-up touches every eager variant without writing the pool."""

from __future__ import annotations

import torch

from kvtier.runner.kernel_warmup import split_counts_to_warm, warm_up_attention
from tests.kernels.kernel_testing import DEVICE


def test_split_counts_cover_every_merge_specialization():
    counts = split_counts_to_warm(64)
    pads = {1 << max(0, (n - 1).bit_length()) for n in counts if n > 1}
    assert counts[0] == 1 and pads == {2, 4, 8, 16, 32, 64}


def test_warm_up_leaves_the_pool_untouched():
    pool = torch.randn(3, 2, 2, 4, 2, 16, device=DEVICE)  # [blocks, F, 2, bs, Hkv, D]
    before = pool.clone()
    warm_up_attention(pool[:, 1], scratch_block=2, num_heads=4, scale=0.25)
    assert torch.equal(pool, before)
