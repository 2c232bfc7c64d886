"""Named architectures for `--load-format dummy`: real configs (random weights) and tiny CPU ones.

Values are the HF config.json fields of the public checkpoints, so a dummy llama-2-13b has
exactly the real model's shapes, FLOPs and KV bytes.
"""

from __future__ import annotations

from typing import Any

_LLAMA2 = {"architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "rms_norm_eps": 1e-5,
           "rope_theta": 10000.0, "max_position_embeddings": 4096, "bos_token_id": 1,
           "eos_token_id": 2}

PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {**_LLAMA2, "hidden_size": 4096, "intermediate_size": 11008,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32},
    "llama-2-13b": {**_LLAMA2, "hidden_size": 5120, "intermediate_size": 13824,
                    "num_hidden_layers": 40, "num_attention_heads": 40, "num_key_value_heads": 40},
    "llama-2-70b": {**_LLAMA2, "hidden_size": 8192, "intermediate_size": 28672,
                    "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8},
    "llama-3.1-8b": {
        "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 500000.0,
        "max_position_embeddings": 131072, "bos_token_id": 128000,
        "eos_token_id": [128001, 128008, 128009],
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
    },
    "mistral-7b": {
        "architectures": ["MistralForCausalLM"], "vocab_size": 32000, "hidden_size": 4096,
        "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "max_position_embeddings": 32768, "bos_token_id": 1, "eos_token_id": 2,
        "sliding_window": None,  # v0.2's file says so; left out, HF's class default is 4096
    },
    "qwen2.5-7b": {
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 152064, "hidden_size": 3584,
        "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
        "num_key_value_heads": 4, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "bos_token_id": 151643, "eos_token_id": 151645,
    },
    "qwen3-8b": {
        "architectures": ["Qwen3ForCausalLM"], "vocab_size": 151936, "hidden_size": 4096,
        "intermediate_size": 12288, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "max_position_embeddings": 40960,
        "bos_token_id": 151643, "eos_token_id": 151645,
    },
}

# Tiny CPU models: small widths and a 4096-entry vocabulary (the offline BPE truncated to it),
# so the LM head and sampling stay cheap on a 2-core CI machine.
_TINY = {"vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 4, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
         "max_position_embeddings": 4096, "head_dim": 16}
PRESETS.update({
    "tiny-llama": {**_TINY, "architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
                   "num_key_value_heads": 4},
    "tiny-llama-gqa": {**_TINY, "architectures": ["LlamaForCausalLM"], "num_attention_heads": 4,
                       "num_key_value_heads": 2},
    "tiny-qwen2": {**_TINY, "architectures": ["Qwen2ForCausalLM"], "num_attention_heads": 4,
                   "num_key_value_heads": 2},
    "tiny-qwen3": {**_TINY, "architectures": ["Qwen3ForCausalLM"], "num_attention_heads": 4,
                   "num_key_value_heads": 2, "tie_word_embeddings": True},
})


def preset_config(name: str) -> dict[str, Any] | None:
    cfg = PRESETS.get(name.lower())
    return dict(cfg) if cfg is not None else None
