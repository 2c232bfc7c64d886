"""kvtier's rotary tables equal transformers' for every scaling it reads (cos and sin as
HF's rotary embedding returns them, attention factor included)."""

from __future__ import annotations

import pytest
import torch

from kvtier.model.hf_config import model_config_from_hf
from kvtier.model.rope import cos_sin_cache

SCALINGS = [
    None,
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 128,
     "beta_fast": 16, "beta_slow": 2, "truncate": False},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "mscale": 0.707, "mscale_all_dim": 1.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "attention_factor": 1.3},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: str(s and s["rope_type"]))
def test_tables_equal_hf_rotary_embedding(scaling):
    import transformers
    from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding

    hf_cfg = transformers.Qwen2Config(hidden_size=128, num_attention_heads=4, num_key_value_heads=2,
                                      max_position_embeddings=512, rope_theta=10000.0,
                                      rope_scaling=dict(scaling) if scaling else None)
    cfg = model_config_from_hf({**hf_cfg.to_dict(), "architectures": ["Qwen2ForCausalLM"]})
    positions = torch.arange(300)
    cos, sin = Qwen2RotaryEmbedding(hf_cfg)(torch.zeros(1, 300, 128), positions[None])
    half = cfg.head_dim // 2
    table = cos_sin_cache(cfg, 300, torch.device("cpu"))
    torch.testing.assert_close(table[:, :half], cos[0, :, :half], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(table[:, half:], sin[0, :, :half], rtol=1e-5, atol=1e-5)
