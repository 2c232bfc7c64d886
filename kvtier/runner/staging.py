"""A step's host-to-device uploads, staged in pinned memory.

From a pageable (numpy) source the CUDA driver copies into a staging buffer of its own
first, and it may wait for the stream to do so; from page-locked memory a non-blocking copy
is a DMA the host only enqueues. Two pinned buffers alternate between steps; before one is
written again, the host waits for the event recorded after its last uploads were issued.
The engine has read step N's tokens before it prepares step N + 2 (async scheduling runs
one step ahead), so that wait finds the copies done; it guards other callers (the cost
model's sweeps) that prepare batches back to back. An upload that does not fit in what is
left of the step's buffer goes up from pageable memory as before.

On the GPU the staged bytes go up by a small kernel reading them through their UVA address
(kvtier/kernels/uva_copy.py), not by the copy engine: there they would queue behind any
other stream's host-tier loads or swap-ins, and the step could not start until those were in.
"""

from __future__ import annotations

import numpy as np
import torch

from kvtier.kernels.uva_copy import copies_as_bytes, copy_bytes

_ALIGN = 64  # bytes: every staged array starts on a cache line


class PinnedStaging:
    def __init__(self, device: torch.device, nbytes: int = 8 << 20):
        self.device = device
        self._buffers: list[np.ndarray] = []
        if device.type == "cuda":
            # numpy views of the pinned tensors, which stay alive beside them.
            self._pinned = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
                            for _ in range(2)]
            self._buffers = [t.numpy() for t in self._pinned]
        self._issued: list[torch.cuda.Event | None] = [None, None]  # after each one's uploads
        self._current = 0
        self._offset = 0
        self.num_fallbacks = 0  # uploads too large for the step's buffer (pageable)

    def next_step(self) -> None:
        """Switch to the other buffer (the step about to be prepared uploads from it), once
        the copies out of it that an earlier step issued are done."""
        if not self._buffers:
            return
        if self._offset:
            event = self._issued[self._current] = torch.cuda.Event()
            event.record()
        self._current ^= 1
        self._offset = 0
        pending = self._issued[self._current]
        if pending is not None:
            pending.synchronize()
            self._issued[self._current] = None

    def host(self, a: np.ndarray) -> torch.Tensor:
        """A CPU tensor holding `a`'s values: a view of pinned memory when it fits."""
        return self._stage(a)[0]

    def _stage(self, a: np.ndarray) -> tuple[torch.Tensor, bool]:
        """(a CPU tensor of `a`'s values, whether it is a view of the pinned buffer)."""
        a = np.ascontiguousarray(a)
        if not self._buffers:
            return torch.from_numpy(a), False
        buf = self._buffers[self._current]
        start = -(-self._offset // _ALIGN) * _ALIGN
        if start + a.nbytes > len(buf):
            self.num_fallbacks += 1
            return torch.from_numpy(a), False
        self._offset = start + a.nbytes
        dst = buf[start:self._offset].view(a.dtype).reshape(a.shape)
        dst[...] = a
        return torch.from_numpy(dst), True

    def _up(self, src: torch.Tensor) -> torch.Tensor:
        dst = torch.empty(src.shape, dtype=src.dtype, device=self.device)
        copy_bytes(dst, src)
        return dst

    def put(self, a: np.ndarray) -> torch.Tensor:
        """`a` on the device, copied from the staged values on the current stream."""
        src, pinned = self._stage(a)
        return self._up(src) if pinned else src.to(self.device, non_blocking=True)

    def put_into(self, dst: torch.Tensor, a: np.ndarray) -> None:
        """dst (a device view of a's shape) = a, on the current stream."""
        src, pinned = self._stage(a)
        if not pinned:
            dst.copy_(src, non_blocking=True)
        elif copies_as_bytes(dst, src):
            copy_bytes(dst, src)
        else:  # strided or converted: on the device, by torch's copy kernel
            dst.copy_(self._up(src))
