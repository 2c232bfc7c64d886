"""Chunked greedy argmax vs torch.argmax: the same index, ties and NaN included."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.argmax import argmax_rows, argmax_rows_ref
from tests.kernels.kernel_testing import DEVICE, gpu


def _rows(B: int, V: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, V, generator=g).to(dtype).to(DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("V", [1, 64, 300])
def test_argmax_matches_torch(dtype: torch.dtype, V: int) -> None:
    x = _rows(7, V, dtype)  # 300 = 4 full chunks of 64 and a partial one
    assert torch.equal(argmax_rows(x, block=64), argmax_rows_ref(x))


def test_ties_take_the_first_index() -> None:
    x = _rows(4, 300, torch.bfloat16)
    x[0, [250, 70, 10]] = 9.0  # across chunks: 10 wins
    x[1, [40, 20]] = 9.0  # inside one chunk: 20
    x[2, [299, 256]] = 9.0  # both in the partial last chunk
    x[3] = 1.0  # a flat row: 0
    out = argmax_rows(x, block=64)
    assert out.tolist() == [10, 20, 256, 0]
    assert torch.equal(out, argmax_rows_ref(x))


def test_nan_and_infinite_rows_answer_as_torch() -> None:
    x = _rows(5, 300, torch.float32)
    x[0] = float("-inf")  # all -inf: 0
    x[1, [200, 150]] = float("nan")  # the first NaN wins
    x[2, 5] = float("inf")
    x[2, 290] = float("nan")  # NaN beats +inf
    x[3, [7, 100]] = float("inf")  # the first +inf
    x[4, 0] = float("nan")
    assert torch.equal(argmax_rows(x, block=64), argmax_rows_ref(x))


def test_signed_zeros_tie_and_negative_nan_wins() -> None:
    x = torch.full((3, 300), -1.0)
    x[0, [70, 10]] = torch.tensor([0.0, -0.0])  # -0.0 == +0.0: the first (10) wins
    x[1, 250] = -float("nan")  # a NaN with its sign bit set is still the largest
    x[1, 5] = float("inf")
    x[2] = -0.0  # a row of -0.0: 0
    for dtype in (torch.float32, torch.bfloat16):
        rows = x.to(dtype).to(DEVICE)
        out = argmax_rows(rows, block=64)
        assert out.tolist() == [10, 250, 0]
        assert torch.equal(out, argmax_rows_ref(rows))


def test_strided_rows_and_empty_batch() -> None:
    x = _rows(6, 400, torch.bfloat16)[:, :300]  # row stride 400
    assert torch.equal(argmax_rows(x, block=64), argmax_rows_ref(x))
    assert argmax_rows(x[:0], block=64).shape == (0,)


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="B, V"):
        argmax_rows(torch.zeros(8, device=DEVICE))
    with pytest.raises(ValueError, match="empty row"):
        argmax_rows(torch.zeros(2, 0, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        argmax_rows(torch.zeros(8, 4, device=DEVICE).t())
    with pytest.raises(ValueError, match="fp32/bf16/fp16"):
        argmax_rows(torch.zeros(2, 4, dtype=torch.int32, device=DEVICE))


@pytest.mark.parametrize("B", [1, 8, 992])
@gpu
def test_argmax_gpu_llama3_vocab(B: int) -> None:
    """Llama 3's 128,256 columns in bf16 (32 chunks, the last partial), ties planted across
    chunk boundaries."""
    x = _rows(B, 128256, torch.bfloat16, seed=B)
    top = x.float().max().item() + 1.0
    x[0, [128255, 4096, 4095]] = top
    x[B // 2, [60000, 59999]] = top
    assert torch.equal(argmax_rows(x), argmax_rows_ref(x))


def test_ops_take_the_kernel_at_every_batch_size(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtier.kernels import argmax as argmax_module
    from kvtier.kernels.ops import TritonOps

    calls: list[int] = []

    def counted(x: torch.Tensor) -> torch.Tensor:
        calls.append(x.shape[0])
        return argmax_rows(x, block=64)

    monkeypatch.setattr(argmax_module, "argmax_rows", counted)
    for B in (1, 64, 300):
        x = _rows(B, 300, torch.bfloat16, seed=B)
        x[:, [3, 200]] = 9.0  # tied maxima: the first (3) wins
        assert TritonOps().argmax_rows(x).tolist() == [3] * B
    assert calls == [1, 64, 300]
