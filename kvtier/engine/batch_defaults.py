"""The batch limits an offline `LLM` gets when it names none, by GPU, as vLLM's LLM class.

vLLM (`EngineArgs.get_batch_defaults`) gives a GPU of at least 70 GiB that is not an A100
1024 seats and 16,384 tokens a step offline (an A100 regressed with the larger budget, its
PR #17885); everywhere else kvtier's own defaults (256 seats, 8,192 tokens) stand. kvtier
also captures decode graphs up to those 1024 seats where vLLM stops at 512: the graphs
share one logits buffer, so the extra sizes cost capture time only (a few seconds at
start-up), and the offline ShareGPT run gains from them
(`results/offline/offline_sharegpt_h200_async_1024_16k_graphs1024.json`).
"""

from __future__ import annotations

from typing import Any

import torch

from kvtier.runner.device import resolve_device

_LARGE_GPU_BYTES = 70 << 30
_LARGE_GPU = {"max_num_seqs": 1024, "max_num_batched_tokens": 16384,
              "max_graph_batch_size": 1024}


def offline_batch_defaults(options: dict[str, Any]) -> dict[str, Any]:
    """The limits to add to an `LLM`'s `options` (those it sets itself win)."""
    if not _large_gpu(options.get("device", "auto")):
        return {}
    defaults = dict(_LARGE_GPU)
    if options.get("enable_chunked_prefill") is False:
        del defaults["max_num_batched_tokens"]  # without chunks a step holds a whole prompt
    return {k: v for k, v in defaults.items() if k not in options}


def _large_gpu(device: str) -> bool:
    dev = resolve_device(device)  # the builder's choice of device, made the same way
    if dev.type != "cuda":
        return False
    props = torch.cuda.get_device_properties(dev)
    return props.total_memory >= _LARGE_GPU_BYTES and "a100" not in props.name.lower()
