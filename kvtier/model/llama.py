"""Decoder-only Llama family: Llama 2 (MHA), Llama 3/3.1 (GQA, rope scaling), Mistral,
Qwen2/2.5 (QKV bias), Qwen3 (q/k RMSNorm). One module; the config's flags pick the variant.

Projections are fused (q|k|v and gate|up) so each is one GEMM; the loader concatenates the
HF checkpoint's separate weights into them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from kvtier.attention.base import AttentionBackend, Rope
from kvtier.attention.metadata import AttentionMetadata
from kvtier.config import ModelConfig
from kvtier.model.ops import TorchOps


def _param(*shape: int, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, dtype=dtype), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype):
        super().__init__()
        self.cfg, self.layer_idx = cfg, layer_idx
        qkv_out = cfg.q_size + 2 * cfg.kv_size
        self.qkv_weight = _param(qkv_out, cfg.hidden_size, dtype=dtype)
        self.qkv_bias = _param(qkv_out, dtype=dtype) if cfg.qkv_bias else None
        self.o_weight = _param(cfg.hidden_size, cfg.q_size, dtype=dtype)
        if cfg.qk_norm:
            self.q_norm = _param(cfg.head_dim, dtype=dtype)
            self.k_norm = _param(cfg.head_dim, dtype=dtype)
        self.scale = cfg.head_dim**-0.5

    def project_qkv(
        self, x: torch.Tensor, positions: torch.Tensor, ops: TorchOps, cos_sin: torch.Tensor,
        rotate: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, Hq, D], k and v [T, Hkv, D]: normed (Qwen3) and rotated, ready to attend
        (rotate=False: not rotated, for a backend that rotates as it stores k/v)."""
        cfg = self.cfg
        qkv = F.linear(x, self.qkv_weight, self.qkv_bias)  # [T, q + 2kv]
        q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
        q = q.view(-1, cfg.num_heads, cfg.head_dim)
        k = k.view(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            q = ops.rms_norm(q, self.q_norm, cfg.rms_norm_eps)
            k = ops.rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        if rotate:
            q, k = ops.rotary(q, k, positions, cos_sin)
        return q, k, v

    def project_out(self, out: torch.Tensor) -> torch.Tensor:
        return F.linear(out.reshape(-1, self.cfg.q_size), self.o_weight)

    def project_kv(
        self, x: torch.Tensor, positions: torch.Tensor, ops: TorchOps, cos_sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K (normed, rotated) and V of tokens whose attention input `x` ([n, hidden], after
        the layer's RMSNorm) is known: a restore from hidden states: the K/V projection alone."""
        cfg = self.cfg
        rows = slice(cfg.q_size, None)
        bias = self.qkv_bias[rows] if self.qkv_bias is not None else None
        k, v = F.linear(x, self.qkv_weight[rows], bias).split([cfg.kv_size, cfg.kv_size], dim=-1)
        k = k.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        v = v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)
        if cfg.qk_norm:
            k = ops.rms_norm(k, self.k_norm, cfg.rms_norm_eps)
        _, k = ops.rotary(k, k, positions, cos_sin)  # rotates its first argument too: unused
        return k, v


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up_weight = _param(2 * cfg.intermediate_size, cfg.hidden_size, dtype=dtype)
        self.down_weight = _param(cfg.hidden_size, cfg.intermediate_size, dtype=dtype)

    def forward(self, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        return F.linear(ops.silu_and_mul(F.linear(x, self.gate_up_weight)), self.down_weight)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int, dtype: torch.dtype):
        super().__init__()
        self.eps = cfg.rms_norm_eps
        self.input_norm = _param(cfg.hidden_size, dtype=dtype)
        self.post_attn_norm = _param(cfg.hidden_size, dtype=dtype)
        self.attn = Attention(cfg, layer_idx, dtype)
        self.mlp = MLP(cfg, dtype)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        ctx: ForwardContext,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`keep`: only these rows go on past attention (the last layer of a step whose
        other rows need no output, see `LlamaForCausalLM.forward`)."""
        q, k, v, residual = self.before_attention(x, residual, positions, ctx)
        if ctx.kv_wait is not None:  # this layer's KV may still be arriving (swap-ins)
            ctx.kv_wait(self.attn.layer_idx)
        out = ctx.attention.forward(self.attn.layer_idx, q, k, v, ctx.kv_cache, ctx.meta,
                                    self.attn.scale, rope=ctx.rope(positions))
        if keep is not None:
            out, residual = out[keep], residual[keep]
        return self.after_attention(out, residual, ctx.ops)

    # The layer in two pieces around attention, so the runner can capture each piece as a
    # CUDA graph at a padded token count while attention (varlen metadata) runs eagerly.
    def before_attention(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        positions: torch.Tensor,
        ctx: ForwardContext,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        ops = ctx.ops
        if residual is None:
            residual, x = x, ops.rms_norm(x, self.input_norm, self.eps)
        else:
            x, residual = ops.fused_add_rms_norm(x, residual, self.input_norm, self.eps)
        if ctx.hidden_sink is not None:  # a hidden-state store keeps every layer's input
            ctx.hidden_sink(self.attn.layer_idx, x)
        q, k, v = self.attn.project_qkv(x, positions, ops, ctx.cos_sin_cache,
                                        rotate=not ctx.attention.fuses_rotary)
        return q, k, v, residual

    def after_attention(
        self, out: torch.Tensor, residual: torch.Tensor, ops: TorchOps
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.attn.project_out(out)
        x, residual = ops.fused_add_rms_norm(x, residual, self.post_attn_norm, self.eps)
        return self.mlp(x, ops), residual


class ForwardContext:
    """Everything a forward pass needs besides activations; passed explicitly, never global."""

    def __init__(
        self,
        ops: TorchOps,
        attention: AttentionBackend,
        kv_cache: torch.Tensor,
        meta: AttentionMetadata,
        cos_sin_cache: torch.Tensor,
        hidden_sink: Callable[[int, torch.Tensor], None] | None = None,
        kv_wait: Callable[[int], None] | None = None,
    ):
        self.ops, self.attention, self.kv_cache = ops, attention, kv_cache
        self.meta, self.cos_sin_cache = meta, cos_sin_cache
        self.hidden_sink = hidden_sink
        # Called with the layer index before each attention: the runner makes the compute
        # stream wait there for the swap-ins of the layer's group (layer-level overlap).
        self.kv_wait = kv_wait

    def rope(self, positions: torch.Tensor) -> Rope | None:
        """What attention needs to rotate q and k itself: only for a backend that fuses
        rotary into its KV write (the layer then leaves q and k unrotated)."""
        return Rope(positions, self.cos_sin_cache) if self.attention.fuses_rotary else None


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.cfg = cfg
        self.embed = _param(cfg.vocab_size, cfg.hidden_size, dtype=dtype)
        self.layers = nn.ModuleList(DecoderLayer(cfg, i, dtype) for i in range(cfg.num_layers))
        self.final_norm = _param(cfg.hidden_size, dtype=dtype)
        self.lm_head = None if cfg.tie_word_embeddings else _param(
            cfg.vocab_size, cfg.hidden_size, dtype=dtype
        )

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
        keep: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids, positions: [T]; returns final hidden states [T, hidden], or only the
        rows `keep` [R] asks for ([R, hidden]).

        Only the rows that get logits need a final hidden state; every row needs its K and V
        in every layer, but after the last layer's attention no row reads another. So the
        last layer's O projection, MLP and the final norm run over `keep` alone: in a step
        of prompt chunks that is most of a layer's GEMMs over all but one row a prompt
        (2.8 % of llama-3.1-8b's linear FLOPs)."""
        x = self.embed_tokens(input_ids)
        residual: torch.Tensor | None = None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, residual = layer(x, residual, positions, ctx, keep if i == last else None)
        assert residual is not None
        x, _ = ctx.ops.fused_add_rms_norm(x, residual, self.final_norm, self.cfg.rms_norm_eps)
        return x

    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """[T] -> [T, hidden] (a vocab-parallel model overrides it: kvtier/distributed/)."""
        return F.embedding(input_ids, self.embed)

    def compute_logits(self, hidden: torch.Tensor, out: torch.Tensor | None = None
                       ) -> torch.Tensor:
        """Logits in the model's dtype. Greedy argmax needs no fp32 copy (the cast is exact, so
        it picks the same token); the sampler casts the rows that need more (kvtier/runner/
        sampler.py). At large batches the cast's copies are a visible share of a decode step
        (results/offline/profile_offline_decode_h200_skip12.json)."""
        head = self.embed if self.lm_head is None else self.lm_head
        # F.linear's own mm; `out=` lets the decode graphs share one logits buffer.
        return torch.mm(hidden, head.t(), out=out)
