"""Tiny random HF checkpoints saved with save_pretrained, for exactness tests."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 512

ARCHS = {
    "llama-mha": ("LlamaConfig", "LlamaForCausalLM", dict(num_attention_heads=4, num_key_value_heads=4)),
    "llama-gqa": ("LlamaConfig", "LlamaForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        rope_theta=500000.0)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=True)),
    "qwen3-yarn": ("Qwen3Config", "Qwen3ForCausalLM", dict(  # Qwen3's long-context config
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32})),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(  # q/k/v and gate/up stored fused
        num_attention_heads=4, num_key_value_heads=2)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(
        num_attention_heads=4, num_key_value_heads=2, sliding_window=None)),
}


def save_tiny_model(kind: str, path: Path, num_layers: int = 4, seed: int = 0) -> Path:
    import transformers

    cfg_name, model_name, extra = ARCHS[kind]
    cfg = getattr(transformers, cfg_name)(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=num_layers,
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=2, pad_token_id=0,
        **extra,
    )
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(cfg).eval()
    # Random init with a larger spread than HF's default, so greedy argmaxes are well apart.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.15)
    model.save_pretrained(path, safe_serialization=True)
    return path


def hf_greedy(path: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    for p in prompts:
        ids = torch.tensor([p])
        gen = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens,
                             do_sample=False, eos_token_id=None, pad_token_id=0)
        outs.append(gen[0, len(p):].tolist())
    return outs
