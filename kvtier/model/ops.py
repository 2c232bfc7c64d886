"""Elementwise model ops behind one small interface, so the Triton versions
(`kvtier.kernels.ops.TritonOps`) replace these pure-torch ones without touching the model."""

from __future__ import annotations

import torch


class TorchOps:
    """Reference math, identical to HF transformers' Llama/Qwen modules (fp32 inside)."""

    name = "torch"

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return weight * xf.to(x.dtype)

    def fused_add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (rms_norm(x + residual), x + residual)."""
        summed = x + residual
        return self.rms_norm(summed, weight, eps), summed

    def rotary(
        self,
        q: torch.Tensor,  # [T, Hq, D]
        k: torch.Tensor,  # [T, Hkv, D]
        positions: torch.Tensor,  # [T] int64
        cos_sin_cache: torch.Tensor,  # [max_pos, D] fp32: cos in [:D/2], sin in [D/2:]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Neox-style rotary (rotate halves), as HF Llama/Qwen apply it."""
        cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)  # [T, D/2] each
        cos = torch.cat((cos, cos), dim=-1).unsqueeze(1).to(q.dtype)  # [T, 1, D]
        sin = torch.cat((sin, sin), dim=-1).unsqueeze(1).to(q.dtype)
        return _rotate(q, cos, sin), _rotate(k, cos, sin)


    def silu_and_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up of a fused [..., 2I] gate_up projection (HF: act(gate) * up)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """Greedy decoding's pick: [B, V] -> [B] int64, the first index of each row's max."""
        return logits.argmax(dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin
