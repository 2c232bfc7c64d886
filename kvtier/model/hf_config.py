"""A model's config.json read as the installed transformers reads it, for the families the
Llama layers here serve: the config class's default for a field the file leaves out, the
rope settings wherever the file keeps them (legacy `rope_scaling`, transformers 5's
`rope_parameters`), which family honours which field. What the layers cannot compute is
refused with the field named, never approximated: a model that runs, runs as in HF."""

from __future__ import annotations

from typing import Any

from kvtier.config import SUPPORTED_ARCHITECTURES, ConfigError, ModelConfig

LLAMA, MISTRAL, PHI3 = "LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM"
QWEN2, QWEN3 = "Qwen2ForCausalLM", "Qwen3ForCausalLM"

# Fields a config.json may leave out take the family's config-class default, as in HF
# (Qwen3's head_dim is 128 whatever hidden_size / heads is; Mistral's window is 4096).
_COMMON = {"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
           "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False}
_QWEN = {"max_position_embeddings": 32768, "num_key_value_heads": 32, "sliding_window": 4096,
         "use_sliding_window": False, "max_window_layers": 28}
_DEFAULTS: dict[str, dict[str, Any]] = {
    LLAMA: {"max_position_embeddings": 2048},
    MISTRAL: {"max_position_embeddings": 4096 * 32, "num_key_value_heads": 8,
              "sliding_window": 4096},
    PHI3: {"max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
           "original_max_position_embeddings": 4096},
    QWEN2: _QWEN,
    QWEN3: {**_QWEN, "head_dim": 128},
}

ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")
# transformers' validation: what each scaling cannot do without.
_ROPE_REQUIRED = {
    "linear": ("factor",), "dynamic": ("factor",), "yarn": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}


def model_config_from_hf(raw: dict[str, Any], name: str = "model") -> ModelConfig:
    arch = _architecture(raw)
    cfg = {**_COMMON, **_DEFAULTS[arch], **raw}
    _check_layers(cfg, arch)
    heads = cfg["num_attention_heads"]
    theta, scaling = rope_settings(cfg, arch)
    eos = cfg.get("eos_token_id")
    return ModelConfig(
        architecture=arch,
        vocab_size=cfg["vocab_size"],
        hidden_size=cfg["hidden_size"],
        intermediate_size=cfg["intermediate_size"],
        num_layers=cfg["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,  # left out or null: MHA
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position_embeddings=cfg["max_position_embeddings"],
        rms_norm_eps=cfg["rms_norm_eps"],
        rope_theta=theta,
        rope_scaling=tuple(sorted(scaling.items())) if scaling else None,
        tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
        qkv_bias=arch == QWEN2,  # Qwen2's q/k/v always have biases, whatever attention_bias says
        qk_norm=arch == QWEN3,
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ()),
        name=name,
        sliding_window=_active_sliding_window(cfg, arch),
    )


def _architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else ""
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(f"unsupported architecture {arch or '<none>'!r}; supported: "
                          + ", ".join(SUPPORTED_ARCHITECTURES))
    return arch


def _check_layers(cfg: dict[str, Any], arch: str) -> None:
    """The fields each family honours in HF and the layers here do not compute."""
    act = cfg["hidden_act"]
    if act not in ("silu", "swish"):  # transformers' ACT2FN maps both to SiLU
        raise ConfigError(f"{arch}: hidden_act {act!r} is not supported (only silu)")
    if arch == LLAMA and cfg["mlp_bias"]:
        raise ConfigError(f"{arch}: mlp_bias is not supported")
    # Llama's and Qwen3's attention_bias adds o_proj's bias too, which the layers (and their
    # tensor-parallel shards) lack; Qwen2's biases are fixed, Mistral and Phi-3 have none.
    if arch in (LLAMA, QWEN3) and cfg["attention_bias"]:
        raise ConfigError(f"{arch}: attention_bias is not supported (biases on q/k/v and on "
                          "o_proj)")


def rope_settings(cfg: dict[str, Any], arch: str) -> tuple[float, dict[str, Any] | None]:
    """(rope_theta, the scaling's fields with `rope_type` set; None for plain rope)."""
    # transformers takes rope_scaling over rope_parameters when a file has both.
    params = dict(cfg.get("rope_scaling") or cfg.get("rope_parameters") or {})
    if any(isinstance(v, dict) for v in params.values()):
        raise ConfigError(f"{arch}: per-layer rope_parameters ({', '.join(params)}) are not "
                          "supported")
    theta = params.pop("rope_theta", None) or cfg["rope_theta"] or 10000.0
    legacy = params.pop("type", None)  # transformers' older name of rope_type
    kind = params.pop("rope_type", None) or legacy or "default"
    if arch == PHI3 and kind in ("su", "yarn"):
        kind = "longrope"  # Phi-3's old names for it, renamed so by transformers
    _check_rope(cfg, arch, kind, params)
    if kind == "default":
        return float(theta), None
    if kind in ("llama3", "yarn", "longrope"):
        # The pretraining length: a top-level field wins (Phi-3's class always has one),
        # then the rope dict's, then max_position_embeddings (transformers' order).
        params["original_max_position_embeddings"] = (
            cfg.get("original_max_position_embeddings")
            or params.get("original_max_position_embeddings") or cfg["max_position_embeddings"])
    # Lists (longrope's factors) as tuples: the config is a frozen, hashable dataclass.
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items()}
    return float(theta), {**fields, "rope_type": kind}


def _check_rope(cfg: dict[str, Any], arch: str, kind: str, params: dict[str, Any]) -> None:
    if kind not in ROPE_TYPES:
        raise ConfigError(f"{arch}: rope type {kind!r} is not supported (supported: "
                          f"{', '.join(ROPE_TYPES)})")
    if arch == PHI3 and kind not in ("default", "longrope"):
        raise ConfigError(f"{arch}: rope type {kind!r} is not supported (transformers' Phi-3 "
                          "takes default or longrope)")
    missing = [f for f in _ROPE_REQUIRED.get(kind, ()) if params.get(f) is None]
    if missing:
        raise ConfigError(f"{arch}: {kind} rope without {', '.join(missing)}")
    # Phi-3 rotates part of each head, and so do the scaled rope types' tables elsewhere
    # (HF's attention then fails on them); Llama's, Mistral's and Qwen's plain rope ignore
    # the field and rotate whole heads.
    partial = params.pop("partial_rotary_factor", cfg.get("partial_rotary_factor"))
    if partial not in (None, 1, 1.0) and (arch == PHI3 or kind != "default"):
        raise ConfigError(f"{arch}: partial_rotary_factor {partial} is not supported "
                          "(rotary over whole heads only)")


def _active_sliding_window(cfg: dict[str, Any], arch: str) -> int | None:
    """The window HF's attention applies on some layer; None if on none."""
    window = cfg.get("sliding_window")
    if arch == LLAMA or not isinstance(window, int) or window <= 0:
        return None  # HF's Llama has no sliding window, whatever its config carries
    if arch in (QWEN2, QWEN3):
        if not cfg["use_sliding_window"]:
            return None  # Qwen configs carry a window they do not use
        layer_types = cfg.get("layer_types") or _qwen_layer_types(cfg, arch)
        if "sliding_attention" not in layer_types:
            return None
    return window


def _qwen_layer_types(cfg: dict[str, Any], arch: str) -> list[str]:
    """Qwen's layers from max_window_layers on slide, as HF's config lays them out."""
    first = cfg.get("max_window_layers")
    if not isinstance(first, int):
        raise ConfigError(f"{arch}: use_sliding_window needs max_window_layers (the first "
                          f"layer that slides), got {first!r}")
    return ["sliding_attention" if i >= first else "full_attention"
            for i in range(cfg["num_hidden_layers"])]


def exact_context(mc: ModelConfig) -> tuple[int, str] | None:
    """The longest context kvtier computes as HF does, and what changes past it; None when
    nothing does. kvtier attends over the whole context with one rotary table."""
    limits = []
    if mc.sliding_window is not None:
        limits.append((mc.sliding_window, f"attends over a sliding window of "
                       f"{mc.sliding_window} tokens, which kvtier does not implement"))
    scaling = mc.rope_scaling_dict or {}
    if scaling.get("rope_type") == "longrope":
        n = int(scaling["original_max_position_embeddings"])
        limits.append((n, f"switches its longrope rotation to the long factors past "
                       f"original_max_position_embeddings ({n} tokens), which kvtier does "
                       "not implement"))
    if scaling.get("rope_type") == "dynamic":
        n = mc.max_position_embeddings
        limits.append((n, f"rescales its dynamic rope past max_position_embeddings ({n} "
                       "tokens), which kvtier does not implement"))
    return min(limits) if limits else None
