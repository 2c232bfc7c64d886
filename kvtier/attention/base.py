"""The attention backend contract: the model hands it q/k/v of one layer, it stores k/v into
the paged cache and returns attention output. Backends are interchangeable (torch, triton)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

import torch

from kvtier.attention.metadata import AttentionMetadata


class Rope(NamedTuple):
    """Rotary inputs a backend applies itself when it fuses rotary into its KV write."""

    positions: torch.Tensor  # [num_tokens] int64
    cos_sin_cache: torch.Tensor  # [max_pos, head_dim] fp32: cos in [:D/2], sin in [D/2:]


class ExternalRows(Protocol):
    """The first `num_rows` rows of a step, all decodes, whose KV is not in the device pool
    (a memory system keeps it elsewhere, e.g. in host memory): the system stores their new
    K/V and computes their attention itself. The backend calls `forward` once per layer
    before its own work, then skips those rows (their slots are < 0: no KV write into the
    device pool; the decode kernel runs over rows [num_rows, num_decodes)), and `join` once
    its own rows are attended: a system attending beside the backend's work (on a side
    stream) makes its rows of `out` final there."""

    num_rows: int

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim] (the backend's whole input)
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        scale: float,
        out: torch.Tensor,  # [num_tokens, num_heads, head_dim]: fill rows [0, num_rows)
        rope: Rope | None,  # given: q and k are not rotated yet (rotate rows [0, num_rows))
    ) -> None: ...

    def join(self, layer_idx: int) -> None:
        """Rows [0, num_rows) of the layer's `out` are complete once this returns (on the
        current stream's order: later work on it sees them)."""

    def begin(self) -> None:
        """A CUDA graph is about to run these rows (its warm-up and capture too, the first
        time): a system whose work runs beside the replay, not called layer by layer,
        starts it here."""

    def end(self, failed: bool) -> None:
        """The graph's run was issued (`failed`: it raised before it ran): the system waits
        for what `begin` started and raises its errors."""


class AttentionBackend(Protocol):
    name: str
    # True when `forward(..., rope=...)` is cheaper than rotating q and k beforehand (the
    # model then hands over q and k unrotated); every backend accepts `rope` either way.
    fuses_rotary: bool

    def forward(
        self,
        layer_idx: int,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        kv_cache: torch.Tensor,  # [num_blocks, F, 2, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
        scale: float,
        out: torch.Tensor | None = None,  # [num_tokens, num_heads, head_dim]; None: allocated
        rope: Rope | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Write k/v at meta.slot_mapping[group] into slot `layer_idx % F`, then attend
        causally over each request's whole context (cached prefix + the new tokens), into
        `out` when given (the piecewise forward passes its static buffer). With `rope`, q
        and k arrive unrotated and are rotated first (Neox style, as the model's ops).
        `meta.external` (ExternalRows): its rows are attended by it, not by the backend."""
        ...
