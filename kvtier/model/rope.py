"""Rotary-embedding tables, with the scalings of HF's configs as transformers computes them:
linear, Llama 3's, YaRN (Qwen2.5's and Qwen3's long-context configs), LongRoPE (Phi-3's)
and dynamic NTK, the last two over the context where HF's tables stay fixed
(`hf_config.exact_context`: the engine serves no longer one)."""

from __future__ import annotations

import math
from typing import Any

import torch

from kvtier.config import ConfigError, ModelConfig


def inv_frequencies(cfg: ModelConfig) -> torch.Tensor:
    d = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = cfg.rope_scaling_dict
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_scale(inv_freq, scaling)
    if kind == "yarn":
        return _yarn_scale(cfg, scaling)
    if kind == "longrope":
        return _longrope_short(cfg, scaling)
    if kind == "dynamic":  # HF rescales only past max_position_embeddings
        return inv_freq
    raise ConfigError(f"unsupported rope_scaling type {kind!r} (supported: linear, llama3, yarn, "
                      "longrope, dynamic)")


def attention_factor(cfg: ModelConfig) -> float:
    """What cos and sin are multiplied by (YaRN's mscale, LongRoPE's; 1 for the others)."""
    s = cfg.rope_scaling_dict
    kind = s.get("rope_type", s.get("type")) if s else None
    if kind not in ("yarn", "longrope"):
        return 1.0
    assert s is not None
    if s.get("attention_factor") is not None:
        return float(s["attention_factor"])
    if kind == "longrope":
        return _longrope_attention_factor(cfg, s)
    factor = _yarn_factor(cfg, s)
    mscale, mscale_all_dim = s.get("mscale"), s.get("mscale_all_dim")
    if mscale and mscale_all_dim:
        return _yarn_mscale(factor, mscale) / _yarn_mscale(factor, mscale_all_dim)
    return _yarn_mscale(factor)


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_original_len(cfg: ModelConfig, s: dict[str, Any]) -> int:
    return int(s.get("original_max_position_embeddings") or cfg.max_position_embeddings)


def _yarn_factor(cfg: ModelConfig, s: dict[str, Any]) -> float:
    if s.get("factor") is not None:
        return float(s["factor"])
    return cfg.max_position_embeddings / _yarn_original_len(cfg, s)


def _yarn_scale(cfg: ModelConfig, s: dict[str, Any]) -> torch.Tensor:
    """YaRN: the frequencies that turn fewer than beta_slow times over the original length
    interpolated by `factor`, those that turn more than beta_fast times kept, a linear ramp
    between (transformers' `_compute_yarn_parameters`)."""
    d, base = cfg.head_dim, cfg.rope_theta
    factor, old_len = _yarn_factor(cfg, s), _yarn_original_len(cfg, s)
    beta_fast, beta_slow = s.get("beta_fast") or 32, s.get("beta_slow") or 1

    def dim_of(rotations: float) -> float:  # the dimension turning `rotations` times
        return d * math.log(old_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dim_of(beta_fast), dim_of(beta_slow)
    if s.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # no zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    pos_freqs = base ** (torch.arange(0, d, 2).float() / d)
    extrapolated = 1 - ramp  # the share of each frequency kept as it was
    return (1.0 / (factor * pos_freqs)) * (1 - extrapolated) + (1.0 / pos_freqs) * extrapolated


def _longrope_short(cfg: ModelConfig, s: dict[str, Any]) -> torch.Tensor:
    """LongRoPE within the pretraining length: each frequency divided by its short factor
    (transformers' `_compute_longrope_parameters`, in its order of operations)."""
    d = cfg.head_dim
    ext_factors = torch.tensor(s["short_factor"], dtype=torch.float32)
    if ext_factors.shape != (d // 2,):
        raise ConfigError(f"longrope short_factor has {ext_factors.numel()} entries, not {d // 2}")
    shape = torch.arange(0, d, 2, dtype=torch.int64).float() / d
    return 1.0 / (ext_factors * cfg.rope_theta**shape)


def _longrope_attention_factor(cfg: ModelConfig, s: dict[str, Any]) -> float:
    old_len = int(s["original_max_position_embeddings"])
    factor = s.get("factor") or cfg.max_position_embeddings / old_len
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(old_len))


def _llama3_scale(inv_freq: torch.Tensor, s: dict[str, Any]) -> torch.Tensor:
    factor, low, high = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def cos_sin_cache(cfg: ModelConfig, max_positions: int, device: torch.device) -> torch.Tensor:
    """[max_positions, head_dim] fp32: cos of the D/2 frequencies, then their sin."""
    inv_freq = inv_frequencies(cfg)
    t = torch.arange(max_positions, dtype=torch.int64).float()
    freqs = torch.outer(t, inv_freq)
    table = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    scale = attention_factor(cfg)
    return (table * scale if scale != 1.0 else table).to(device)
