"""Sampled tokens that stay on the device until the host asks (async scheduling).

With `SchedulerConfig.async_scheduling` the engine launches step N+1 before it reads step
N's tokens, so the host work of one step (scheduling, input preparation, output handling)
runs while the GPU computes the other. Two things make that exact:

  * a decode whose input is step N's token arrives as PLACEHOLDER_TOKEN; `fill_placeholders`
    writes the token into the step's device input ids from step N's device tensor, in
    stream order after step N's sampling and before step N+1's embedding;
  * step N's tokens come back through a pinned buffer, copied without blocking and read only
    after its event: two buffers alternate, because step N+1's copy may land while the host
    still reads step N's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from kvtier.core.plan import PLACEHOLDER_TOKEN, ScheduledRequest, StepResult
from kvtier.kernels.uva_copy import copies_as_bytes, copy_bytes


@dataclass
class PendingStep:
    """A launched step; `result()` blocks until its tokens are on the host."""

    request_ids: list[str] = field(default_factory=list)
    host_tokens: torch.Tensor | None = None  # pinned, filled by a non-blocking copy
    event: torch.cuda.Event | None = None
    ready: StepResult | None = None  # a step that sampled synchronously (or nothing)
    prompt_logprobs: dict = field(default_factory=dict)  # read back at launch already

    def result(self) -> StepResult:
        if self.ready is not None:
            return self.ready
        assert self.host_tokens is not None
        if self.event is not None:
            self.event.synchronize()
        tokens = self.host_tokens[: len(self.request_ids)].tolist()
        self.ready = StepResult(sampled=dict(zip(self.request_ids, tokens)),
                                prompt_logprobs=self.prompt_logprobs)
        return self.ready


class DeviceTokens:
    """The last launched step's sampled tokens on the device, by request id."""

    def __init__(self, max_rows: int, device: torch.device):
        self.device = device
        self.tokens: torch.Tensor | None = None
        self.row_of: dict[str, int] = {}
        pin = device.type == "cuda"
        self._buffers = [torch.empty(max_rows, dtype=torch.int64, pin_memory=pin)
                         for _ in range(2)]
        self._next = 0

    def keep(self, request_ids: list[str], tokens: torch.Tensor) -> None:
        """`tokens` [len(request_ids)] int64 on the device, from the step just launched."""
        self.tokens = tokens
        self.row_of = dict(zip(request_ids, range(len(request_ids))))

    def copy_to_host(self, request_ids: list[str], tokens: torch.Tensor,
                     prompt_logprobs: dict | None = None) -> PendingStep:
        buf = self._buffers[self._next]
        self._next ^= 1
        n = len(request_ids)
        event = None
        if self.device.type == "cuda" and copies_as_bytes(buf[:n], tokens):
            # Written through the pinned buffer's UVA address: the copy engine would queue
            # this behind the host tier's stores (kvtier/kernels/uva_copy.py).
            copy_bytes(buf[:n], tokens)
        else:
            buf[:n].copy_(tokens, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return PendingStep(request_ids, buf, event, prompt_logprobs=prompt_logprobs or {})

    def placeholder_sources(self, scheduled: list[ScheduledRequest],
                            input_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """(token indices holding a placeholder, the row of each one's sampled token), or
        None. Placeholders are decodes (one token each), and decodes lead both the plan and
        the batch, so a placeholder's token index is its request's index in the plan."""
        dst = np.flatnonzero(input_ids == PLACEHOLDER_TOKEN)
        if not len(dst):
            return None
        row_of = self.row_of
        try:
            src = np.fromiter((row_of[scheduled[i].request_id] for i in dst), dtype=np.int64,
                              count=len(dst))
        except KeyError as e:
            raise RuntimeError(f"no sampled token in flight for request {e}") from None
        return dst, src

    def fill(self, input_ids: torch.Tensor, where: tuple[np.ndarray, np.ndarray],
             upload: Callable[[np.ndarray], torch.Tensor]) -> None:
        """Write the in-flight tokens into `input_ids` (device) at the placeholder rows;
        `upload` puts the index arrays on the device."""
        assert self.tokens is not None
        dst, src = map(upload, where)
        input_ids[dst] = self.tokens[src]
