"""The UVA byte copy against a plain copy: words and odd byte counts, both directions
between pinned host memory and the device (on the GPU), and bad shapes refused."""

from __future__ import annotations

import pytest
import torch

from kvtier.kernels.uva_copy import copy_bytes, copy_bytes_ref
from tests.kernels.kernel_testing import DEVICE, gpu


def _host(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(-(1 << 30), 1 << 30, (n,), generator=g).to(dtype)
    return t.pin_memory() if DEVICE.type == "cuda" else t


@pytest.mark.parametrize(("n", "dtype"), [(1, torch.int64), (5000, torch.int32),
                                          (37, torch.uint8), (3, torch.int16)])
def test_upload_equals_a_plain_copy(n: int, dtype: torch.dtype) -> None:
    src = _host(n, dtype, n)
    got = torch.full((n,), 7, dtype=dtype, device=DEVICE)
    want = torch.full((n,), 7, dtype=dtype, device=DEVICE)
    copy_bytes(got, src)
    copy_bytes_ref(want, src)
    assert torch.equal(got.cpu(), want.cpu()) and torch.equal(got.cpu(), src.cpu())


def test_read_back_into_host_memory() -> None:
    dev = torch.arange(-50, 1000, dtype=torch.int64, device=DEVICE)
    host = _host(dev.numel(), torch.int64, 1)
    copy_bytes(host, dev)
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(host, dev.cpu())


def test_misaligned_view_moves_bytes() -> None:
    """A view starting one byte in cannot be read as words: bytes are moved instead."""
    src = _host(64, torch.uint8, 2)
    dst = torch.zeros(65, dtype=torch.uint8, device=DEVICE)
    copy_bytes(dst[1:], src)
    assert torch.equal(dst[1:].cpu(), src.cpu()) and int(dst[0]) == 0


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="bytes"):
        copy_bytes(torch.zeros(3, dtype=torch.int32, device=DEVICE), _host(4, torch.int32, 0))
    with pytest.raises(ValueError, match="contiguous"):
        copy_bytes(torch.zeros(4, 2, device=DEVICE)[:, 0], _host(4, torch.float32, 0))


@gpu
def test_upload_does_not_wait_for_another_streams_loads() -> None:
    """An upload issued after another stream's 1 GiB of copy-engine loads (~20 ms over
    PCIe) lands while those are still moving."""
    side = torch.cuda.Stream()
    big_host = torch.empty(128 << 20, dtype=torch.uint8).pin_memory()
    big_dev = torch.empty(128 << 20, dtype=torch.uint8, device="cuda")
    src = _host(1024, torch.int64, 3)
    dst = torch.zeros(1024, dtype=torch.int64, device="cuda")
    copy_bytes(dst, src)  # compiled for this shape first: a compile outlasts the loads
    dst.zero_()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        for _ in range(8):
            big_dev.copy_(big_host, non_blocking=True)
    copy_bytes(dst, src)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    assert not side.query(), "the loads finished first: the check says nothing"
    assert torch.equal(dst.cpu(), src)
    torch.cuda.synchronize()

