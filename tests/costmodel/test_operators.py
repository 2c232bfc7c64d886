"""Operator counts against hand-computed FLOPs and bytes of a small known model."""

import pytest

from kvtier.config import ModelConfig
from kvtier.costmodel.operators import (
    OpKind,
    Shapes,
    attn_decode,
    attn_prefill,
    causal_pairs,
    gemm,
    head_ops,
    layer_elementwise,
    step_ops,
    totals,
)
from kvtier.costmodel.shape import StepShape
from kvtier.model.loader import resolve_model_config

# h=64, 4 heads x 16, 2 KV heads, MLP 128, vocab 1000, 2 layers.
MC = ModelConfig(architecture="LlamaForCausalLM", vocab_size=1000, hidden_size=64,
                 intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                 max_position_embeddings=512, name="hand")
S = Shapes.of(MC)
# Three decodes at contexts 10, 20, 30 (after the step), one 5-token prompt; 4 rows sample.
SHAPE = StepShape(num_decodes=3, decode_ctx_sum=60, decode_ctx_max=30, prefills=((5, 0),),
                  num_sampled=4)


def test_shapes_per_gpu():
    assert (S.q, S.kv, S.inter, S.vocab) == (64, 32, 128, 1000)
    s2 = Shapes.of(MC, tp=2)
    assert (s2.q, s2.kv, s2.inter, s2.vocab, s2.heads, s2.kv_heads) == (32, 16, 64, 500, 2, 1)
    assert S.gemm_dims()["qkv"] == (128, 64) and S.gemm_dims()["down"] == (64, 128)
    with pytest.raises(ValueError):
        Shapes.of(MC, tp=3)


def test_gemm_counts():
    op = gemm("qkv", 8, 128, 64, 2)
    assert op.flops == 2 * 8 * 128 * 64 == 131072
    assert op.bytes == 2 * (128 * 64 + 8 * 64 + 8 * 128) == 19456


def test_decode_attention_counts():
    op = attn_decode(S, 3, 60)
    assert op.flops == 4 * 4 * 16 * 60 == 15360  # QK^T and PV over 60 keys, 4 heads
    kv_read = 2 * 32 * 2 * 60  # K and V, 32 columns, bf16, 60 tokens
    q_out = 2 * 3 * 64 * 2
    kv_write = 4 * 3 * 32 * 2
    assert op.bytes == kv_read + q_out + kv_write == 9216


def test_prefill_attention_counts():
    assert causal_pairs(5, 0) == 15 and causal_pairs(4, 10) == 4 * 10 + 10
    op = attn_prefill(S, ((5, 0),))
    assert op.flops == 4 * 4 * 16 * 15 == 3840
    assert op.bytes == 2 * 32 * 2 * 5 + 2 * 5 * 64 * 2 + 4 * 5 * 32 * 2 == 3200


def test_elementwise_counts():
    op = layer_elementwise(S, 8)
    norms = 2 * 4 * 8 * 64 * 2
    rotary = 2 * 8 * (64 + 32) * 2 + 8 * 16 * 4
    silu_mul = 3 * 8 * 128 * 2  # fused: read gate and up, write the product
    assert op.bytes == norms + rotary + silu_mul == 17920 and op.flops == 0


def test_step_ops_of_a_mixed_step():
    ops = step_ops(S, SHAPE)
    names = [o.name for o in ops]
    assert names.count("qkv") == 2 and names.count("lm_head") == 1
    assert names.count("attn_decode") == 2 and names.count("attn_prefill") == 2
    lm = next(o for o in ops if o.name == "lm_head")
    assert lm.flops == 2 * 4 * 1000 * 64  # only the 4 sampled rows
    # GEMM FLOPs of a step are 2 x tokens x the layers' weight count, except past the last
    # layer's attention: there only the 4 sampled rows go on.
    qkv_weights, rest_weights = 64 * 128, 64 * 64 + 64 * 256 + 128 * 64
    gemm_flops = sum(o.flops for o in ops if o.kind is OpKind.GEMM and o.name != "lm_head")
    assert gemm_flops == 2 * (2 * 8 * qkv_weights + (8 + 4) * rest_weights)
    assert [o.name for o in ops if o.kind is OpKind.GEMM][-4:] == ["o", "gate_up", "down",
                                                                   "lm_head"]


def test_head_ops_without_sampling_skips_lm_head():
    assert [o.name for o in head_ops(S, 7, 0)] == ["embed", "final_norm"]


def test_decode_step_bytes_are_the_weights_plus_kv():
    """A one-request decode of Llama-2-13B reads every weight once (the embedding table is
    gathered, not read) and the request's KV: the HBM roofline of a decode step."""
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    s = Shapes.of(mc)
    shape = StepShape(num_decodes=1, decode_ctx_sum=1000, decode_ctx_max=1000, num_sampled=1)
    _, byts = totals(step_ops(s, shape))
    weights = (mc.num_params() - mc.vocab_size * mc.hidden_size) * 2
    kv = 1000 * mc.kv_bytes_per_token(2)
    assert abs(byts - (weights + kv)) / (weights + kv) < 0.002
