"""Kernel tests run on the GPU when there is one, else in Triton's CPU interpreter.

TRITON_INTERPRET must be set before any kernel module is imported (triton.jit reads it at
decoration time), hence here, at conftest import, and only without CUDA so GPU runs compile
real kernels. (tests/conftest.py does the same; this keeps the folder self-contained.)"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# fp32 references must be exact fp32, not tf32, to check the kernels at 1e-5.
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def _poison(t: torch.Tensor) -> torch.Tensor:
    if t.is_floating_point():
        t.fill_(float("nan"))
    return t


@pytest.fixture(autouse=True)
def poison_new_tensors(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every float tensor made by torch.empty/empty_like (kernel outputs and split-K partials
    included) starts as NaN, so an element a kernel forgets to write fails assert_close."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned_empty(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(empty(*args, **kwargs))

    def poisoned_empty_like(*args: Any, **kwargs: Any) -> torch.Tensor:
        return _poison(empty_like(*args, **kwargs))

    monkeypatch.setattr(torch, "empty", poisoned_empty)
    monkeypatch.setattr(torch, "empty_like", poisoned_empty_like)
    yield
