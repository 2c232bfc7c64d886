"""Pinned staging of a step's uploads: values arrive intact, a buffer is reused only after
its copies are done, and what does not fit goes up from pageable memory."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from kvtier.runner.staging import PinnedStaging

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def test_cpu_staging_passes_arrays_through() -> None:
    s = PinnedStaging(torch.device("cpu"))
    a = np.arange(7, dtype=np.int64)
    s.next_step()
    t = s.put(a)
    assert t.device.type == "cpu" and t.tolist() == a.tolist()


@pytest.mark.gpu
@needs_gpu
def test_gpu_staging_reuses_a_buffer_only_after_its_copies() -> None:
    """Copies stuck behind a busy stream; two steps later the same pinned buffer is written
    again at once. Without the wait the DMA would read the new values."""
    s = PinnedStaging(torch.device("cuda"), nbytes=4096)
    rng = np.random.default_rng(0)
    for _ in range(4):
        s.next_step()
        torch.cuda._sleep(50_000_000)  # ~25 ms: the uploads below wait behind it
        arrays = [rng.integers(0, 1 << 30, size=n).astype(dt)
                  for n, dt in ((5, np.int64), (33, np.int32), (34, np.int64))]
        outs = [s.put(a) for a in arrays]
        assert s.host(arrays[0]).is_pinned()
        s.next_step()
        s.next_step()  # back to this step's buffer: waits for its copies
        for a in arrays:
            s.host(np.zeros_like(a))  # overwrite the staged values
        for a, t in zip(arrays, outs):
            assert t.is_cuda and t.cpu().numpy().tolist() == a.tolist()
    assert s.num_fallbacks == 0


@pytest.mark.gpu
@needs_gpu
def test_gpu_staging_falls_back_when_full() -> None:
    s = PinnedStaging(torch.device("cuda"), nbytes=256)
    s.next_step()
    big = np.arange(100, dtype=np.int64)  # 800 bytes > 256
    assert s.put(big).cpu().tolist() == big.tolist()
    assert s.num_fallbacks == 1


def test_cpu_put_into_writes_the_view() -> None:
    s = PinnedStaging(torch.device("cpu"))
    s.next_step()
    dst = torch.zeros(2, 6, dtype=torch.int64)
    s.put_into(dst[:, 1:4], np.arange(6, dtype=np.int64).reshape(2, 3))
    assert dst.tolist() == [[0, 0, 1, 2, 0, 0], [0, 3, 4, 5, 0, 0]]


@pytest.mark.gpu
@needs_gpu
def test_gpu_put_into_contiguous_strided_and_converted_views() -> None:
    """Through the UVA copy when the view is contiguous and of the array's dtype, else up
    first and then copied on the device: the values are the same either way."""
    s = PinnedStaging(torch.device("cuda"), nbytes=4096)
    s.next_step()
    flat = torch.zeros(10, dtype=torch.int64, device="cuda")
    table = torch.zeros(3, 8, dtype=torch.int64, device="cuda")
    wide = torch.zeros(4, dtype=torch.int64, device="cuda")
    s.put_into(flat[2:7], np.arange(5, dtype=np.int64))
    s.put_into(table[:, 2:4], np.arange(6, dtype=np.int64).reshape(3, 2))
    s.put_into(wide, np.array([1, -2, 3, 4], dtype=np.int32))
    assert flat.tolist() == [0, 0, 0, 1, 2, 3, 4, 0, 0, 0]
    assert table[:, 2:4].tolist() == [[0, 1], [2, 3], [4, 5]] and int(table.sum()) == 15
    assert wide.tolist() == [1, -2, 3, 4] and s.num_fallbacks == 0
