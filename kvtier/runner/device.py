"""Choosing device, dtype, attention backend and elementwise ops."""

from __future__ import annotations

import torch

from kvtier.config import ConfigError

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
           "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "half": torch.float16, "fp16": torch.float16,
           "float64": torch.float64}


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(name)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device 'cuda' requested but no CUDA GPU is available")
    return dev


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in _DTYPES:
        raise ConfigError(f"unknown dtype {name!r}; choose from {', '.join(sorted(_DTYPES))}")
    return _DTYPES[name]


def _use_triton(backend: str, device: torch.device) -> bool:
    if backend not in ("auto", "torch", "triton"):
        raise ConfigError(f"unknown attention backend {backend!r} (auto, torch, triton)")
    return backend == "triton" or (backend == "auto" and device.type == "cuda")


def make_attention_backend(backend: str, device: torch.device):
    if _use_triton(backend, device):
        from kvtier.attention.triton_backend import TritonAttentionBackend

        return TritonAttentionBackend()
    from kvtier.attention.torch_backend import TorchAttentionBackend

    return TorchAttentionBackend()


def make_ops(backend: str, device: torch.device):
    if _use_triton(backend, device):
        from kvtier.kernels.ops import TritonOps

        return TritonOps()
    from kvtier.model.ops import TorchOps

    return TorchOps()
