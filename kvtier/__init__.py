"""kvtier: an LLM serving engine whose KV cache lives in a memory hierarchy."""

from kvtier.sampling_params import SamplingParams

__all__ = ["LLM", "SamplingParams"]


def __getattr__(name: str):  # lazy: `import kvtier` must not import torch-heavy modules
    if name == "LLM":
        from kvtier.entrypoints.llm import LLM

        return LLM
    raise AttributeError(name)
