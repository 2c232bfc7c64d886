"""Weights of one tensor-parallel rank, sharded as they load: dummy weights are the
single-GPU ones (the same generator draws, parameter by parameter, then this rank's part
kept), a safetensors checkpoint is read slice by slice (`get_slice`: only this rank's rows
or columns come off the disk)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvtier.config import ConfigError
from kvtier.distributed.layers import VocabParallelLlama
from kvtier.distributed.parallel_state import TPGroup
from kvtier.distributed.sharding import TPShard
from kvtier.model.checkpoint import checkpoint_tensors
from kvtier.model.llama import DecoderLayer, LlamaForCausalLM
from kvtier.model.loader import _DIRECT

# A source tensor (or safetensors slice) -> this rank's part of it.
Take = Callable[[Any], torch.Tensor]


def build_sharded_model(shard: TPShard, ckpt: Path | None, dtype: torch.dtype,
                        device: torch.device, seed: int, group: TPGroup | None
                        ) -> VocabParallelLlama:
    with torch.device(device):
        model = VocabParallelLlama(shard, dtype, group)
    for p in model.parameters():  # the vocabulary's padding rows stay zero
        p.data.zero_()
    if ckpt is None:
        init_sharded_dummy(model, seed)
    else:
        load_sharded_safetensors(model, ckpt)
    return model.eval()


def _rows(r: range) -> Take:
    return lambda t: t[r.start:r.stop]


def _cols(r: range) -> Take:
    return lambda t: t[:, r.start:r.stop]


def whole(t: Any) -> torch.Tensor:
    return t[:]


def fused_part(shard: TPShard, name: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of the single-GPU model's parameter `name` (kvtier's fused layout)."""
    mc = shard.mc
    if name in ("embed", "lm_head"):
        return _rows(shard.vocab())(full)
    q, kv = shard.q_cols(), shard.kv_cols()
    if name.endswith(("attn.qkv_weight", "attn.qkv_bias")):
        k_off, v_off = mc.q_size, mc.q_size + mc.kv_size
        return torch.cat([full[q.start:q.stop], full[k_off + kv.start:k_off + kv.stop],
                          full[v_off + kv.start:v_off + kv.stop]])
    if name.endswith("attn.o_weight"):
        return _cols(q)(full)
    i = shard.mlp_cols()
    if name.endswith("mlp.gate_up_weight"):
        inter = mc.intermediate_size
        return torch.cat([full[i.start:i.stop], full[inter + i.start:inter + i.stop]])
    if name.endswith("mlp.down_weight"):
        return _cols(i)(full)
    return full  # norms: every rank holds them whole


def init_sharded_dummy(model: VocabParallelLlama, seed: int) -> None:
    """The single-GPU dummy weights (`init_dummy_weights`: norms one, the rest N(0, 0.02)
    from one generator in parameter order), drawn whole one parameter at a time and cut."""
    shard = model.shard
    with torch.device("meta"):
        full_model = LlamaForCausalLM(shard.mc, model.embed.dtype)
    local = dict(model.named_parameters())
    gen = torch.Generator(device=model.embed.device).manual_seed(seed)
    for name, meta in full_model.named_parameters():
        dst = local[name]
        if meta.dim() == 1 and "bias" not in name:
            dst.data.fill_(1.0)
            continue
        full = torch.empty(meta.shape, dtype=meta.dtype, device=dst.device)
        full.normal_(0.0, 0.02, generator=gen)
        part = fused_part(shard, name, full)
        dst.data[: part.shape[0]].copy_(part)


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")


def _hf_target(model: VocabParallelLlama, hf_name: str
               ) -> tuple[torch.Tensor, slice, Take] | None:
    """(local parameter, its rows that this tensor fills, what to take of the tensor), or
    None for a tensor the model does not use."""
    shard, all_rows = model.shard, slice(None)
    if hf_name in ("model.embed_tokens.weight", "lm_head.weight"):
        param = model.embed if hf_name.startswith("model.") else model.lm_head
        return (param, slice(0, model.vocab_len), _rows(shard.vocab())) if param is not None \
            else None
    if hf_name == "model.norm.weight":
        return model.final_norm, all_rows, whole
    m = _LAYER.fullmatch(hf_name)
    if m is None or "rotary_emb" in hf_name:
        return None
    layer = model.layers[int(m.group(1))]
    assert isinstance(layer, DecoderLayer)
    rest = m.group(2)
    if rest in _DIRECT:
        param = layer.get_parameter(_DIRECT[rest])
        if rest.endswith(("o_proj.weight", "down_proj.weight")):
            return param, all_rows, _cols(shard.q_cols() if "o_proj" in rest else shard.mlp_cols())
        return param, all_rows, whole
    q, kv, inter = len(shard.q_cols()), len(shard.kv_cols()), shard.intermediate
    pm = re.fullmatch(r"self_attn\.([qkv])_proj\.(weight|bias)", rest)
    if pm:
        attn = layer.attn
        param = attn.qkv_weight if pm.group(2) == "weight" else attn.qkv_bias
        if param is None:
            return None
        where = {"q": (slice(0, q), shard.q_cols()), "k": (slice(q, q + kv), shard.kv_cols()),
                 "v": (slice(q + kv, q + 2 * kv), shard.kv_cols())}[pm.group(1)]
        return param, where[0], _rows(where[1])
    if rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        dst = slice(0, inter) if "gate" in rest else slice(inter, 2 * inter)
        return layer.mlp.gate_up_weight, dst, _rows(shard.mlp_cols())
    raise ConfigError(f"unexpected tensor {hf_name!r} in checkpoint")


def load_sharded_safetensors(model: VocabParallelLlama, ckpt: Path) -> None:
    filled: dict[int, int] = {}  # rows written, per parameter (q, k, v fill one in parts)
    for name, lazy in checkpoint_tensors(ckpt, model.shard.mc):
        target = _hf_target(model, name)
        if target is None:
            continue
        param, rows, take = target
        part = take(lazy)
        dst = param.data[rows]
        if dst.shape != part.shape:
            raise ConfigError(f"{name}: rank {model.shard.rank}'s part has shape "
                              f"{tuple(part.shape)}, expected {tuple(dst.shape)}")
        dst.copy_(part)
        filled[id(param)] = filled.get(id(param), 0) + dst.shape[0]
    vocab_rows = {id(model.embed), id(model.lm_head)}
    missing = [n for n, p in model.named_parameters() if filled.get(id(p), 0)
               < (model.vocab_len if id(p) in vocab_rows else p.shape[0])]
    if missing:
        raise ConfigError(f"checkpoint {str(ckpt)!r} lacks weights for: {', '.join(missing[:5])}")
