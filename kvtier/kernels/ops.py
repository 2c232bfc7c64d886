"""Triton versions of the model's elementwise ops, signature-compatible with
`kvtier.model.ops.TorchOps` so the model swaps one for the other."""

from __future__ import annotations

import torch

from kvtier.kernels import argmax as _argmax
from kvtier.kernels import rms_norm as _rms
from kvtier.kernels import rotary as _rot
from kvtier.kernels import silu_and_mul as _act


class TritonOps:
    name = "triton"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return _rms.rms_norm(x, weight, eps)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (rms_norm(x + residual), x + residual)."""
        return _rms.fused_add_rms_norm(x, residual, weight, eps)

    def rotary(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        positions: torch.Tensor,  # [T] int64
        cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32: cos in [:D/2], sin in [D/2:]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox-style rotary (rotate halves); out-of-place, like TorchOps."""
        return _rot.rotary(q, k, positions, cos_sin_cache)

    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a fused [..., 2I] gate_up projection."""
        return _act.silu_and_mul(gate_up)

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy decoding's pick: the chunked kernel (torch's answer, faster at every batch
        size measured)."""
        return _argmax.argmax_rows(logits)
