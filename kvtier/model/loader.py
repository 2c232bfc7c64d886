"""Find a model's architecture (local HF directory or dummy preset) and build it with weights."""

from __future__ import annotations

import json
import re
from pathlib import Path

import torch

from kvtier.config import ConfigError, ModelConfig
from kvtier.model.checkpoint import checkpoint_tensors
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.llama import DecoderLayer, LlamaForCausalLM
from kvtier.model.presets import PRESETS, preset_config


def resolve_model_config(model: str, load_format: str) -> tuple[ModelConfig, Path | None]:
    """(architecture, checkpoint directory or None for dummy weights)."""
    path = Path(model).expanduser()
    if path.is_dir():
        cfg_file = path / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"model directory {str(path)!r} has no config.json")
        cfg = model_config_from_hf(json.loads(cfg_file.read_text()), name=path.name)
        return cfg, (None if load_format == "dummy" else path)
    preset = preset_config(model)
    if preset is None:
        raise ConfigError(
            f"unknown model {model!r}: not a local directory with config.json, "
            f"nor a dummy preset ({', '.join(sorted(PRESETS))})"
        )
    if load_format not in ("auto", "dummy"):
        raise ConfigError(f"preset {model!r} has no weights; use --load-format dummy")
    return model_config_from_hf(preset, name=model), None


def build_model(
    cfg: ModelConfig, ckpt: Path | None, dtype: torch.dtype, device: torch.device, seed: int
) -> LlamaForCausalLM:
    with torch.device(device):
        model = LlamaForCausalLM(cfg, dtype)
    if ckpt is None:
        init_dummy_weights(model, seed)
    else:
        load_safetensors(model, ckpt)
    return model.eval()


def init_dummy_weights(model: LlamaForCausalLM, seed: int) -> None:
    """Random weights with the real shapes (vLLM's --load-format dummy); norms start at one."""
    gen = torch.Generator(device=model.embed.device).manual_seed(seed)
    for name, p in model.named_parameters():
        if p.dim() == 1 and "bias" not in name:
            p.data.fill_(1.0)
        else:
            p.data.normal_(0.0, 0.02, generator=gen)


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_DIRECT = {
    "input_layernorm.weight": "input_norm",
    "post_attention_layernorm.weight": "post_attn_norm",
    "self_attn.o_proj.weight": "attn.o_weight",
    "self_attn.q_norm.weight": "attn.q_norm",
    "self_attn.k_norm.weight": "attn.k_norm",
    "mlp.down_proj.weight": "mlp.down_weight",
}


def _target(model: LlamaForCausalLM, hf_name: str) -> tuple[torch.Tensor, slice] | None:
    """Where a checkpoint tensor goes: (parameter, rows within it); None to skip it."""
    cfg = model.cfg
    whole = slice(None)
    if hf_name == "model.embed_tokens.weight":
        return model.embed, whole
    if hf_name == "model.norm.weight":
        return model.final_norm, whole
    if hf_name == "lm_head.weight":
        return (model.lm_head, whole) if model.lm_head is not None else None
    m = _LAYER.fullmatch(hf_name)
    if m is None or "rotary_emb" in hf_name:
        return None
    layer: DecoderLayer = model.layers[int(m.group(1))]  # type: ignore[assignment]
    rest = m.group(2)
    if rest in _DIRECT:
        return layer.get_parameter(_DIRECT[rest]), whole
    q, kv, inter = cfg.q_size, cfg.kv_size, cfg.intermediate_size
    shard = {"q_proj": slice(0, q), "k_proj": slice(q, q + kv), "v_proj": slice(q + kv, q + 2 * kv)}
    pm = re.fullmatch(r"self_attn\.([qkv]_proj)\.(weight|bias)", rest)
    if pm:
        param = layer.attn.qkv_weight if pm.group(2) == "weight" else layer.attn.qkv_bias
        return (param, shard[pm.group(1)]) if param is not None else None
    if rest == "mlp.gate_proj.weight":
        return layer.mlp.gate_up_weight, slice(0, inter)
    if rest == "mlp.up_proj.weight":
        return layer.mlp.gate_up_weight, slice(inter, 2 * inter)
    raise ConfigError(f"unexpected tensor {hf_name!r} in checkpoint")


def load_safetensors(model: LlamaForCausalLM, ckpt: Path) -> None:
    expected = {id(p): n for n, p in model.named_parameters()}
    rows_loaded: dict[int, int] = {}
    for name, lazy in checkpoint_tensors(ckpt, model.cfg):
        target = _target(model, name)
        if target is None:
            continue
        param, rows = target
        tensor = lazy[:]
        dst = param.data[rows]
        if dst.shape != tensor.shape:
            raise ConfigError(f"{name}: shape {tuple(tensor.shape)} != {tuple(dst.shape)}")
        dst.copy_(tensor)
        rows_loaded[id(param)] = rows_loaded.get(id(param), 0) + tensor.shape[0]
    missing = [n for i, n in expected.items() if rows_loaded.get(i, 0) == 0]
    if missing:
        raise ConfigError(f"checkpoint {str(ckpt)!r} lacks weights for: {', '.join(missing[:5])}")
