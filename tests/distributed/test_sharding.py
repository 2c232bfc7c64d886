"""Which heads, columns and vocabulary rows each rank holds, and weights sharded at load time
equal the single-GPU weights cut by the same rule (dummy and safetensors)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvtier.config import ConfigError, ModelConfig
from kvtier.costmodel.operators import Shapes
from kvtier.distributed.loading import build_sharded_model, fused_part
from kvtier.distributed.sharding import TPShard, check_tp
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.loader import build_model
from kvtier.model.presets import PRESETS

CPU = torch.device("cpu")


def config(preset: str, **kw) -> ModelConfig:
    return model_config_from_hf({**PRESETS[preset], **kw}, name=preset)


def test_kv_heads_split_then_replicated():
    mc = config("tiny-llama-gqa")  # 4 query heads, 2 KV heads
    two = [TPShard(mc, r, 2) for r in range(2)]
    assert [list(s.heads()) for s in two] == [[0, 1], [2, 3]]
    assert [list(s.kv_heads()) for s in two] == [[0], [1]]
    four = [TPShard(mc, r, 4) for r in range(4)]
    # One KV head per rank, each the head its query head reads (GQA: head j reads j // 2).
    assert [list(s.kv_heads()) for s in four] == [[0], [0], [1], [1]]
    assert all(s.kv_replicas == 2 and s.config().num_kv_heads == 1 for s in four)
    assert [list(s.heads()) for s in four] == [[0], [1], [2], [3]]


def test_vocab_rows_cover_the_vocabulary_once():
    mc = config("tiny-llama", vocab_size=4097)
    shards = [TPShard(mc, r, 4) for r in range(4)]
    assert all(s.vocab_per_rank == 1025 for s in shards)
    rows = [i for s in shards for i in s.vocab()]
    assert rows == list(range(4097)) and len(shards[-1].vocab()) == 1022


@pytest.mark.parametrize("tp, error", [(3, "divide by tensor_parallel_size 3"), (0, ">= 1")])
def test_bad_tp_is_a_clear_error(tp, error):
    with pytest.raises(ConfigError, match=error):
        check_tp(config("tiny-llama"), tp)


def test_kv_heads_that_do_not_replicate_evenly_are_refused():
    with pytest.raises(ConfigError, match="KV heads"):
        check_tp(config("tiny-llama", num_attention_heads=6, num_key_value_heads=3), 2)


def test_cost_model_prices_the_same_shard():
    for preset, tp in [("tiny-llama-gqa", 2), ("tiny-llama-gqa", 4), ("llama-3.1-8b", 8)]:
        mc = config(preset)
        s, shard = Shapes.of(mc, tp), TPShard(mc, 0, tp)
        assert (s.heads, s.kv_heads, s.inter, s.vocab) == (
            shard.num_heads, shard.num_kv_heads, shard.intermediate, shard.vocab_per_rank)


# ---- weights ---------------------------------------------------------------------------
PRESETS_UNDER_TEST = ["tiny-llama-gqa", "tiny-qwen2", "tiny-qwen3"]


def _assert_shards_equal_full(mc: ModelConfig, tp: int, full, ckpt: Path | None) -> None:
    params = dict(full.named_parameters())
    for rank in range(tp):
        shard = TPShard(mc, rank, tp)
        local = build_sharded_model(shard, ckpt, torch.float32, CPU, seed=3, group=None)
        names = [n for n, _ in local.named_parameters()]
        assert names == list(params)
        for name, p in local.named_parameters():
            want = fused_part(shard, name, params[name].data)
            assert torch.equal(p.data[: want.shape[0]], want), (rank, name)
            assert not p.data[want.shape[0]:].any()  # vocabulary padding rows stay zero


@pytest.mark.parametrize("preset", PRESETS_UNDER_TEST)
@pytest.mark.parametrize("tp", [2, 4])
def test_sharded_dummy_weights_are_the_single_gpu_ones(preset, tp):
    mc = config(preset, vocab_size=1001)  # a vocabulary that does not split evenly
    full = build_model(mc, None, torch.float32, CPU, seed=3)
    _assert_shards_equal_full(mc, tp, full, None)


def _save_hf_checkpoint(model, preset: str, path: Path, vocab: int, fused: bool = False) -> Path:
    """`model` (kvtier's fused layout) as an HF checkpoint: separate q/k/v, gate/up (or,
    `fused`, stored as Phi-3 stores them: one qkv_proj, one gate_up_proj)."""
    from safetensors.torch import save_file

    mc = model.cfg
    t = {"model.embed_tokens.weight": model.embed, "model.norm.weight": model.final_norm}
    if model.lm_head is not None:
        t["lm_head.weight"] = model.lm_head
    for i, layer in enumerate(model.layers):
        pre, a = f"model.layers.{i}.", layer.attn
        q, k, v = a.qkv_weight.split([mc.q_size, mc.kv_size, mc.kv_size])
        gate, up = layer.mlp.gate_up_weight.chunk(2)
        t.update({pre + "self_attn.q_proj.weight": q, pre + "self_attn.k_proj.weight": k,
                  pre + "self_attn.v_proj.weight": v, pre + "self_attn.o_proj.weight": a.o_weight,
                  pre + "mlp.gate_proj.weight": gate, pre + "mlp.up_proj.weight": up,
                  pre + "mlp.down_proj.weight": layer.mlp.down_weight,
                  pre + "input_layernorm.weight": layer.input_norm,
                  pre + "post_attention_layernorm.weight": layer.post_attn_norm})
        if fused:
            for part in ("q", "k", "v"):
                del t[pre + f"self_attn.{part}_proj.weight"]
            del t[pre + "mlp.gate_proj.weight"], t[pre + "mlp.up_proj.weight"]
            t[pre + "self_attn.qkv_proj.weight"] = a.qkv_weight
            t[pre + "mlp.gate_up_proj.weight"] = layer.mlp.gate_up_weight
        if a.qkv_bias is not None:
            for name, b in zip("qkv", a.qkv_bias.split([mc.q_size, mc.kv_size, mc.kv_size])):
                t[pre + f"self_attn.{name}_proj.bias"] = b
        if mc.qk_norm:
            t[pre + "self_attn.q_norm.weight"] = a.q_norm
            t[pre + "self_attn.k_norm.weight"] = a.k_norm
    path.mkdir()
    save_file({k: v.detach().contiguous() for k, v in t.items()}, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps({**PRESETS[preset], "vocab_size": vocab}))
    return path


@pytest.mark.parametrize("preset", PRESETS_UNDER_TEST)
def test_sharded_checkpoint_equals_the_unsharded_weights(preset, tmp_path):
    mc = config(preset, vocab_size=1001)
    source = build_model(mc, None, torch.float32, CPU, seed=11)
    ckpt = _save_hf_checkpoint(source, preset, tmp_path / preset, 1001)
    full = build_model(mc, ckpt, torch.float32, CPU, seed=0)  # the single-GPU loader
    for tp in (2, 4):
        _assert_shards_equal_full(mc, tp, full, ckpt)


def test_a_fused_checkpoint_loads_and_shards_as_the_unfused_one(tmp_path):
    """Phi-3's storage (checkpoint.py hands each fused tensor over as its parts' rows)."""
    mc = config("tiny-llama-gqa", vocab_size=1001)
    source = build_model(mc, None, torch.float32, CPU, seed=11)
    ckpt = _save_hf_checkpoint(source, "tiny-llama-gqa", tmp_path / "fused", 1001, fused=True)
    full = build_model(mc, ckpt, torch.float32, CPU, seed=0)
    for (name, p), q in zip(full.named_parameters(), source.parameters()):
        assert torch.equal(p, q), name
    for tp in (2, 4):
        _assert_shards_equal_full(mc, tp, full, ckpt)


def test_a_checkpoint_missing_a_tensor_is_refused(tmp_path):
    mc = replace(config("tiny-llama"), vocab_size=1001)
    source = build_model(mc, None, torch.float32, CPU, seed=1)
    ckpt = _save_hf_checkpoint(source, "tiny-llama", tmp_path / "m", 1001)
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(ckpt / "model.safetensors"))
    del tensors["model.layers.2.mlp.up_proj.weight"]
    save_file(tensors, str(ckpt / "model.safetensors"))
    with pytest.raises(ConfigError, match="lacks weights"):
        build_sharded_model(TPShard(mc, 1, 2), ckpt, torch.float32, CPU, 0, None)
