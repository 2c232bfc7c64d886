"""The sampler's grammar masks: the packed words unpack as xgrammar packs them, and only
the masked rows' disallowed logits change."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.structured.mask import mask_logits, unpack

xgr = pytest.importorskip("xgrammar")


def random_words(rows: int, vocab: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**31), 2**31, size=(rows, (vocab + 31) // 32), dtype=np.int64)
    return words.astype(np.int32)


@pytest.mark.parametrize("vocab", [32, 1000, 2048, 151_936])
def test_unpack_is_xgrammars_bit_order(vocab):
    words = random_words(3, vocab, vocab)
    logits = torch.randn(3, vocab)
    want = logits.clone()
    xgr.apply_token_bitmask_inplace(want, torch.from_numpy(words))
    got = logits.clone()
    allowed = unpack(torch.from_numpy(words), vocab)
    got[~allowed] = float("-inf")
    assert torch.equal(got, want)


def _masked(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows 1 and 3 of `logits` masked, in a copy; the two masks unpacked)."""
    words = random_words(2, logits.shape[1], 1)
    out = logits.clone()
    mask_logits(out, [1, 3], [words[0], words[1]],
                lambda a: torch.from_numpy(a).to(logits.device))
    return out, unpack(torch.from_numpy(words), logits.shape[1])


def test_only_the_masked_rows_change():
    logits = torch.randn(4, 3000)
    out, allowed = _masked(logits)
    assert torch.equal(out[[0, 2]], logits[[0, 2]])
    for row, mask in ((1, allowed[0]), (3, allowed[1])):
        assert torch.equal(out[row][mask], logits[row][mask])
        assert torch.isneginf(out[row][~mask]).all()


@pytest.mark.gpu
def test_masks_on_the_gpu_equal_the_cpu():
    logits = torch.randn(4, 128_256)
    on_cpu, _ = _masked(logits)
    on_gpu, _ = _masked(logits.cuda())
    assert torch.equal(on_gpu.cpu(), on_cpu)
