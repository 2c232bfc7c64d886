"""Merging two parts' attention by log-sum-exp (kvtier/kernels/merge_attention.py): the
kernel against its torch reference, and the reference against attention over the whole
context; an empty part (lse -inf) weighs nothing; the output takes out's dtype."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.merge_attention import merge_attention, merge_attention_ref
from tests.kernels.kernel_testing import DEVICE, assert_close, gpu


def parts(batch: int, heads: int, dim: int, split: int, length: int = 40):
    """(o1, lse1, o2, lse2, whole): attention of random q over tokens [0, split) and
    [split, length), and over all of them, fp32."""
    g = torch.Generator().manual_seed(batch * heads + dim + split)
    q = torch.randn(batch, heads, dim, generator=g)
    k = torch.randn(batch, heads, length, dim, generator=g)
    v = torch.randn(batch, heads, length, dim, generator=g)

    def attend(lo: int, hi: int):
        s = torch.einsum("bhd,bhtd->bht", q, k[:, :, lo:hi]) * dim ** -0.5
        if hi == lo:
            return torch.zeros(batch, heads, dim), torch.full((batch, heads), -torch.inf)
        return torch.einsum("bht,bhtd->bhd", s.softmax(-1), v[:, :, lo:hi]), s.logsumexp(-1)

    return (*attend(0, split), *attend(split, length), attend(0, length)[0])


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,split", [((3, 4, 8), 12), ((1, 32, 128), 39), ((2, 4, 96), 0)])
def test_the_kernel_merges_as_the_reference_and_as_one_pass(shape, split, out_dtype):
    o1, lse1, o2, lse2, whole = (t.to(DEVICE) for t in parts(*shape, split))
    ref = merge_attention_ref(o1, lse1, o2, lse2, torch.empty_like(o1))
    assert_close(ref, whole, torch.float32)  # split == 0: the first part is empty
    out = torch.full(shape, float("nan"), dtype=out_dtype, device=DEVICE)
    assert merge_attention(o1.to(out_dtype), lse1, o2.to(out_dtype), lse2, out) is out
    assert_close(out, ref.to(out_dtype), out_dtype)


def test_strided_rows_and_bad_shapes():
    o1, lse1, o2, lse2, whole = (t.to(DEVICE) for t in parts(4, 2, 16, 5))
    wide = torch.full((4, 3, 16), float("nan"), device=DEVICE)
    out = wide[:, 1:]  # a strided view, rows contiguous: the backend's out rows
    merge_attention(o1, lse1, o2, lse2, out)
    assert_close(out, whole)
    assert torch.isnan(wide[:, 0]).all()  # nothing outside out written
    with pytest.raises(ValueError):
        merge_attention(o1, lse1[:, :1], o2, lse2, torch.empty_like(o1))
    with pytest.raises(ValueError):
        merge_attention(o1, lse1, o2, lse2, torch.empty(4, 2, 8, device=DEVICE))


@gpu
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_the_kernel_on_a_batch_of_decode_rows(out_dtype):
    o1, lse1, o2, lse2, _ = (t.to(DEVICE) for t in parts(64, 32, 128, 300, 1000))
    ref = merge_attention_ref(o1, lse1, o2, lse2, torch.empty_like(o1))
    out = torch.full_like(o1, float("nan"), dtype=out_dtype)
    merge_attention(o1, lse1, o2, lse2, out)
    assert_close(out, ref.to(out_dtype), out_dtype)
