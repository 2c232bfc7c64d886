"""Real HF configs of models kvtier was not tuned on: each config.json is read as the
installed transformers reads it (fields it leaves out, legacy and transformers-5 rope
fields, which families honour a field), and computed exactly, or refused at load with the
field named. The configs are written as raw JSON, so both sides read the same file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvtier import LLM, SamplingParams
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.rope import cos_sin_cache
from tests.hf_models import hf_greedy

TYPES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Phi3ForCausalLM": "phi3",
         "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
SHORT = [1.0 + 0.1 * i for i in range(8)]  # longrope factors, one per frequency of a 16-dim head
LONG = [2.0 + 0.3 * i for i in range(8)]
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}


def raw(arch: str = "LlamaForCausalLM", **fields: Any) -> dict[str, Any]:
    """A tiny config.json of `arch`: 16-dim heads unless `fields` say otherwise."""
    return {"architectures": [arch], "model_type": TYPES[arch], "vocab_size": 512,
            "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
            "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
            "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, **fields}


def hf_config(tmp_path: Path, config: dict[str, Any]) -> Any:
    import transformers

    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return transformers.AutoConfig.from_pretrained(tmp_path)


def save_model(path: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """Random weights (biases and norms too, so their loading shows) under `config`, the
    config.json then restored to the raw file (save_pretrained rewrites it)."""
    import transformers

    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(hf_config(path, config))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1 or name.endswith("bias"):
                p.normal_(0.0, 0.15)
            else:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    model.save_pretrained(path, safe_serialization=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


# --- rotary tables -------------------------------------------------------------------------

ROPES = {
    "theta-in-rope-parameters": raw(rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "llama3-without-original-length": raw(rope_scaling=LLAMA3),
    "linear-by-legacy-type-key": raw(rope_parameters={"type": "linear", "factor": 2.0}),
    "rope-scaling-over-rope-parameters": raw(
        rope_scaling={"rope_type": "linear", "factor": 4.0}, rope_theta=7000.0,
        rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 5000.0}),
    "yarn-top-level-original-length": raw(
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        original_max_position_embeddings=32),
    "dynamic": raw(rope_scaling={"type": "dynamic", "factor": 2.0}),
    "longrope": raw(rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG,
                                  "original_max_position_embeddings": 64}),
    "phi3-longrope": raw("Phi3ForCausalLM", original_max_position_embeddings=64,
                         rope_scaling={"type": "longrope", "short_factor": SHORT,
                                       "long_factor": LONG}),
    "phi3-su-is-longrope": raw("Phi3ForCausalLM", original_max_position_embeddings=64,
                               rope_scaling={"type": "su", "short_factor": SHORT,
                                             "long_factor": LONG}),
    "qwen3-head-dim-left-out": raw("Qwen3ForCausalLM", hidden_size=256),
    "llama-partial-factor-unused-by-default-rope": raw(partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("name", sorted(ROPES))
def test_rotary_tables_equal_transformers(tmp_path, name):
    """cos and sin as the model's own rotary embedding returns them, over every position
    kvtier serves the model to."""
    import transformers

    config = ROPES[name]
    model = transformers.AutoModelForCausalLM.from_config(hf_config(tmp_path, config))
    cfg = model_config_from_hf(config)
    n = EngineArgs(model=str(tmp_path), load_format="dummy").create_engine_config() \
        .scheduler.max_model_len
    cos, sin = model.model.rotary_emb(torch.zeros(1, n, 8), torch.arange(n)[None])
    table = cos_sin_cache(cfg, n, torch.device("cpu"))
    half = cfg.head_dim // 2
    assert table.shape == (n, cos.shape[-1])
    torch.testing.assert_close(table[:, :half], cos[0, :, :half], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(table[:, half:], sin[0, :, :half], rtol=1e-6, atol=1e-6)


# --- fields a config.json leaves out, and where a window or rope limits the context ----------

def _strip(config: dict[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k not in names}


FIELDS = {
    "qwen3-defaults": _strip(raw("Qwen3ForCausalLM", hidden_size=256), "num_key_value_heads",
                             "max_position_embeddings"),
    "mistral-defaults": _strip(raw("MistralForCausalLM"), "num_key_value_heads",
                               "max_position_embeddings"),
    "phi3-defaults": _strip(raw("Phi3ForCausalLM"), "num_key_value_heads",
                            "max_position_embeddings"),
    "llama-defaults": _strip(raw("LlamaForCausalLM"), "num_key_value_heads",
                             "max_position_embeddings"),
    "explicit-head-dim-and-eps": raw("MistralForCausalLM", head_dim=32, rms_norm_eps=1e-5,
                                     tie_word_embeddings=True),
}


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_fields_a_config_leaves_out_take_transformers_defaults(tmp_path, name):
    hf = hf_config(tmp_path, FIELDS[name])
    cfg = model_config_from_hf(FIELDS[name])
    assert (cfg.head_dim, cfg.num_kv_heads, cfg.rms_norm_eps, cfg.max_position_embeddings,
            cfg.tie_word_embeddings) == (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads,
        hf.num_key_value_heads, hf.rms_norm_eps, hf.max_position_embeddings,
        hf.tie_word_embeddings)


def _sliding_layers(hf: Any) -> bool:
    if hf.model_type == "llama":
        return False  # HF's Llama attention has no window, whatever its config carries
    types = getattr(hf, "layer_types", None)
    window = getattr(hf, "sliding_window", None)
    return window is not None and (types is None or "sliding_attention" in types)


WINDOWS = {
    "mistral-window-left-out": (_strip(raw("MistralForCausalLM"), "max_position_embeddings"),
                                4096),
    "mistral-null-window": (raw("MistralForCausalLM", sliding_window=None), None),
    "qwen2-window-unused": (raw("Qwen2ForCausalLM", sliding_window=16), None),
    "qwen2-window-on-upper-layers": (raw("Qwen2ForCausalLM", sliding_window=16,
                                         use_sliding_window=True, max_window_layers=1), 16),
    "qwen2-no-layer-past-max-window-layers": (
        raw("Qwen2ForCausalLM", sliding_window=16, use_sliding_window=True,
            max_window_layers=28), None),
    "llama-ignores-a-window": (raw(sliding_window=16), None),
}


@pytest.mark.parametrize("name", sorted(WINDOWS))
def test_sliding_window_as_transformers_applies_it(tmp_path, name):
    config, window = WINDOWS[name]
    hf = hf_config(tmp_path, config)
    assert (hf.sliding_window if _sliding_layers(hf) else None) == window
    assert model_config_from_hf(config).sliding_window == window


def test_a_long_context_rope_caps_the_context_where_it_stays_exact(tmp_path):
    """longrope switches every position to its long factors past the pretraining length,
    dynamic NTK rescales past max_position_embeddings: kvtier serves up to there."""
    longrope = ROPES["phi3-longrope"]
    hf_config(tmp_path, longrope)
    assert EngineArgs(model=str(tmp_path), load_format="dummy").create_engine_config() \
        .scheduler.max_model_len == 64
    with pytest.raises(ConfigError, match="original_max_position_embeddings"):
        EngineArgs(model=str(tmp_path), load_format="dummy", max_model_len=65) \
            .create_engine_config()
    hf_config(tmp_path, ROPES["dynamic"])
    with pytest.raises(ConfigError, match="dynamic"):
        EngineArgs(model=str(tmp_path), load_format="dummy", max_model_len=257) \
            .create_engine_config()


# --- refused, with the field named ------------------------------------------------------------

REFUSED = {
    "phi3-partial-rotary-in-rope-parameters": (
        raw("Phi3ForCausalLM", rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                "partial_rotary_factor": 0.5}),
        "partial_rotary_factor 0.5"),
    "phi3-partial-rotary": (raw("Phi3ForCausalLM", partial_rotary_factor=0.75),
                            "partial_rotary_factor 0.75"),
    "llama-partial-rotary-with-scaled-rope": (
        raw(partial_rotary_factor=0.5, rope_scaling={"type": "linear", "factor": 2.0}),
        "partial_rotary_factor"),
    "llama-attention-bias": (raw(attention_bias=True), "attention_bias"),
    "qwen3-attention-bias": (raw("Qwen3ForCausalLM", attention_bias=True), "attention_bias"),
    "llama-mlp-bias": (raw(mlp_bias=True), "mlp_bias"),
    "gelu": (raw(hidden_act="gelu_pytorch_tanh"), "hidden_act 'gelu_pytorch_tanh'"),
    "phi3-linear-rope": (raw("Phi3ForCausalLM", rope_scaling={"type": "linear", "factor": 2.0}),
                         "rope type 'linear'"),
    "unknown-rope-type": (raw(rope_parameters={"rope_type": "proportional", "rope_theta": 1e4}),
                          "rope type 'proportional'"),
    "per-layer-rope": (raw(rope_parameters={"full_attention": {"rope_type": "default"},
                                            "sliding_attention": {"rope_type": "default"}}),
                       "per-layer rope_parameters"),
    "llama3-without-factors": (raw(rope_scaling={"rope_type": "llama3", "factor": 8.0}),
                               "low_freq_factor"),
    "gemma": ({**raw(), "architectures": ["GemmaForCausalLM"]}, "'GemmaForCausalLM'"),
    "mixtral": ({**raw(), "architectures": ["MixtralForCausalLM"]}, "'MixtralForCausalLM'"),
    "no-architectures": ({**raw(), "architectures": []}, "unsupported architecture"),
    "qwen2-window-without-first-layer": (
        raw("Qwen2ForCausalLM", sliding_window=64, use_sliding_window=True,
            max_window_layers=None), "needs max_window_layers"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_what_kvtier_cannot_compute_is_refused_by_name(name):
    config, message = REFUSED[name]
    with pytest.raises(ConfigError, match=message):
        model_config_from_hf(config)


# --- greedy outputs against transformers' generate ---------------------------------------------

PROMPTS = [[5, 17, 42, 99, 3, 250], list(range(10, 40))]
NEW_TOKENS = 24

GREEDY = {
    # Llama 3.2 1B's tied embeddings, Mistral-Nemo's head_dim past hidden/heads, a
    # transformers-5 rope_parameters with its theta.
    "llama-tied-wide-heads": raw(tie_word_embeddings=True, head_dim=32, rms_norm_eps=1e-5,
                                 rope_parameters={"rope_type": "default", "rope_theta": 1e6}),
    "qwen2-qkv-bias": raw("Qwen2ForCausalLM", rope_theta=1e6),
    "qwen3-qk-norm-head-dim-left-out": raw("Qwen3ForCausalLM", hidden_size=128,
                                           num_attention_heads=2, num_key_value_heads=1),
    "qwen2-window-on-upper-layers": raw("Qwen2ForCausalLM", sliding_window=64,
                                        use_sliding_window=True, max_window_layers=1),
    "mistral-ignores-attention-bias": raw("MistralForCausalLM", attention_bias=True),
    "phi3-longrope": ROPES["phi3-longrope"],
    "llama-dynamic": raw(rope_scaling={"type": "dynamic", "factor": 4.0},
                         max_position_embeddings=64),
}


@pytest.mark.parametrize("name", sorted(GREEDY))
def test_greedy_matches_transformers(tmp_path, name):
    path = save_model(tmp_path, GREEDY[name])
    want = hf_greedy(path, PROMPTS, NEW_TOKENS)
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=64)
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    assert [o.outputs[0].token_ids for o in outs] == want
