"""A step's small uploads through the pinned buffer's UVA address, by a kernel, instead of
the copy engine.

The copy engine serves one direction's copies in the order they reach it, whatever stream
issued them: a step's token ids queued behind another stream's page loads wait for all of
them. Beside the copy engine's host-tier loads the engine's 8K prefill took +86 % (its
inputs waited), a stand-in with no uploads of its own +1.3 %
(results/kernels/host_page_io_clocks_{engine,stand-in}_h200_6b5d64f.json); the driver's
queues are per stream and no pool stream shares the compute stream's
(results/kernels/command_queue_conns_default_h200_9c877ae.json), so the wait is the copy
engine's. A kernel that reads the pinned bytes through their UVA address (as
kvtier/kernels/host_page_io.py does: Triton passes a pinned CPU tensor's device address)
runs in its own stream's order and never enters that queue.

`copy_bytes_ref` (a plain copy) is the CPU path and the test oracle.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check

BLOCK = 1024  # words (or bytes) a program moves: a step's inputs are a few to a few hundred KiB


@triton.jit
def _copy_words_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)


def copy_bytes(dst: torch.Tensor, src: torch.Tensor) -> None:
    """dst's bytes = src's: contiguous, equal byte sizes; on the GPU one side is pinned host
    memory (or both on the device). Runs on the current stream."""
    check(dst.is_contiguous() and src.is_contiguous(), "copy_bytes: contiguous tensors only")
    nbytes = src.numel() * src.element_size()
    check(dst.numel() * dst.element_size() == nbytes,
          lambda: f"copy_bytes: {dst.numel() * dst.element_size()} != {nbytes} bytes")
    if nbytes == 0:
        return
    s, d = src.reshape(-1).view(torch.uint8), dst.reshape(-1).view(torch.uint8)
    if nbytes % 4 == 0 and src.data_ptr() % 4 == 0 and dst.data_ptr() % 4 == 0:
        s, d = s.view(torch.int32), d.view(torch.int32)  # whole words: a quarter the lanes
    n = s.numel()
    _copy_words_kernel[(triton.cdiv(n, BLOCK),)](s, d, n, BLOCK=BLOCK)


def copies_as_bytes(dst: torch.Tensor, src: torch.Tensor) -> bool:
    """Whether dst.copy_(src) is a plain byte copy that `copy_bytes` can make: both
    contiguous, one dtype and one element count."""
    return (dst.dtype == src.dtype and dst.numel() == src.numel() and dst.is_contiguous()
            and src.is_contiguous())


def copy_bytes_ref(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.reshape(-1).view(torch.uint8).copy_(src.reshape(-1).view(torch.uint8))
