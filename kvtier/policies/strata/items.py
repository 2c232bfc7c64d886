"""The host tier's plan items (kvtier/kv/host_tier.py: HostStore, HostLoad): the runner's
hooks stage them for the step's copy stream (transfers.py), the cost model prices them."""

from __future__ import annotations

from typing import Any

from kvtier.costmodel.hardware import CopyMechanism
from kvtier.kv.host_tier import HostBackup, HostLoad, HostPrefetch, HostStore


def _tier(runner: Any):
    tier = runner.copies.tier
    if tier is None:
        raise RuntimeError("a plan carries host-tier copies but the runner has no host tier "
                           "(kvtier.policies.strata.install.enable_host_tier)")
    return tier


def run_host_stores(runner: Any, items: list[HostStore] | list[HostBackup]) -> None:
    _tier(runner).stage(items, ())


def run_host_loads(runner: Any, items: list[HostLoad] | list[HostPrefetch]) -> None:
    _tier(runner).stage((), items)


def _price(cost_model: Any, count: int, to_device: bool) -> float:
    """Seconds for `count` pages (one device block each) moved by the kernel (the default
    io-backend), as a serial part of the step: the affine curve of the hardware profile
    (calibrated on the H200), one launch per step and direction."""
    curves = cost_model.hw.h2d if to_device else cost_model.hw.d2h
    return curves[CopyMechanism.KERNEL_GATHER].seconds(cost_model.config.block_bytes * count)


def price_host_stores(cost_model: Any, count: int) -> float:
    return _price(cost_model, count, to_device=False)


def price_in_background(cost_model: Any, count: int) -> float:
    """Backups and prefetches: none of the step's time. The runner issues them after the
    step's loads and the forward waits for no event of theirs; the next step's copies
    wait for them first, which the cost model does not price (it assumes they end
    within a step: a step of a long forward, as bubble filling wants)."""
    return 0.0


def price_host_loads(cost_model: Any, count: int) -> float:
    return _price(cost_model, count, to_device=True)
