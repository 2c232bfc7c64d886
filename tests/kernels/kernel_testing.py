"""Shared helpers for the kernel tests: device choice, tolerances, random paged KV layouts."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest
import torch

F = TypeVar("F", bound=Callable[..., Any])
INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
DEVICE = torch.device("cpu" if INTERPRET or not torch.cuda.is_available() else "cuda")
_no_gpu = pytest.mark.skipif(INTERPRET or not torch.cuda.is_available(), reason="needs a GPU")


def gpu(fn: F) -> F:
    """GPU-sized cases: only with a real GPU (the interpreter would take minutes)."""
    return pytest.mark.gpu(_no_gpu(fn))
# Relative error bound (Frobenius norm) per dtype, from the acceptance criteria.
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-2}


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype | None = None) -> None:
    """Every element written and finite (outputs are poisoned with NaN beforehand), and
    ||out - ref|| / ||ref|| within the dtype's tolerance."""
    dtype = dtype or out.dtype
    assert out.shape == ref.shape
    assert torch.isfinite(out).all(), f"{(~torch.isfinite(out)).sum()} elements not written/finite"
    err = ((out.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()
    assert err <= TOL[dtype], f"relative error {err:.3g} > {TOL[dtype]} ({dtype})"


@dataclass
class PagedKV:
    cache: torch.Tensor  # [num_blocks, F, 2, block_size, Hkv, D], random contents
    layer: torch.Tensor  # cache[:, slot]: the strided view kernels see
    block_tables: torch.Tensor  # [R, max_blocks] int32, random distinct physical blocks
    seq_lens: torch.Tensor  # [R] int32


def make_paged_kv(
    seq_lens: list[int], num_kv_heads: int, head_dim: int, dtype: torch.dtype,
    block_size: int = 16, layers_per_block: int = 2, slot: int = 1, spare_blocks: int = 3,
    device: torch.device = DEVICE,
) -> PagedKV:
    """A random pool where each request owns distinct, shuffled blocks (never 0..n in order,
    so a kernel that ignores the block table fails)."""
    per_req = [-(-s // block_size) for s in seq_lens]
    max_blocks = max(per_req) + 1  # one unused column holding garbage ids
    num_blocks = sum(per_req) + spare_blocks
    cache = torch.randn(num_blocks, layers_per_block, 2, block_size, num_kv_heads, head_dim,
                        device=device).to(dtype)
    perm = torch.randperm(num_blocks).tolist()
    tables = torch.full((len(seq_lens), max_blocks), 10**6, dtype=torch.int32)
    used = 0
    for b, n in enumerate(per_req):
        tables[b, :n] = torch.tensor(perm[used : used + n], dtype=torch.int32)
        used += n
    return PagedKV(cache, cache[:, slot], tables.to(device),
                   torch.tensor(seq_lens, dtype=torch.int32, device=device))


def start_loc(lens: list[int], device: torch.device = DEVICE) -> torch.Tensor:
    """[len(lens) + 1] int32 exclusive prefix sums."""
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return torch.tensor(out, dtype=torch.int32, device=device)
