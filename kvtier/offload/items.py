"""The host tier's plan items (kvtier/kv/host_tier.py: HostStore, HostLoad): the runner's
hooks stage them for the step's copy stream (transfers.py), the cost model prices them."""

from __future__ import annotations

from typing import Any

from kvtier.costmodel.hardware import CopyMechanism
from kvtier.kv.host_tier_items import HostBackup, HostLoad, HostPrefetch, HostStore


def _tier(runner: Any):
    tier = runner.copies.tier
    if tier is None:
        raise RuntimeError("a plan carries host-tier copies but the runner has no host tier "
                           "(kvtier.offload.install.enable_host_tier)")
    return tier


def run_host_stores(runner: Any, items: list[HostStore] | list[HostBackup]) -> None:
    _tier(runner).stage(items, ())


def run_host_loads(runner: Any, items: list[HostLoad] | list[HostPrefetch]) -> None:
    _tier(runner).stage((), items)


def copy_seconds(cost_model: Any, count: int, to_device: bool, direct: bool = False) -> float:
    """Seconds for `count` pages (one device block each) in one step (the step's serial
    part for its stores and loads; for backups and prefetches their copy time alone), from
    the hardware profile's affine curves (measured on the H200): the kernel's, one launch
    per step and direction; the copy engine's batch-call curve with one piece per
    block (an upper bound: runs of consecutive blocks go as one piece), or, on a profile
    without one, its per-page curve with one call per block."""
    curves = cost_model.hw.h2d if to_device else cost_model.hw.d2h
    nbytes = cost_model.config.block_bytes * count
    if direct:
        curve = curves.get(CopyMechanism.MEMCPY_BATCH, curves[CopyMechanism.MEMCPY_PER_PAGE])
        return curve.seconds(nbytes, num_transfers=count)
    return curves[CopyMechanism.KERNEL_GATHER].seconds(nbytes)


def price_host_stores(cost_model: Any, count: int) -> float:
    return copy_seconds(cost_model, count, to_device=False)


def price_host_stores_direct(cost_model: Any, count: int) -> float:
    return copy_seconds(cost_model, count, to_device=False, direct=True)


def price_host_loads_direct(cost_model: Any, count: int) -> float:
    return (copy_seconds(cost_model, count, to_device=True, direct=True)
            + _load_step_s(cost_model, CopyMechanism.MEMCPY_BATCH, count))


def _load_step_s(cost_model: Any, mechanism: CopyMechanism, count: int) -> float:
    """What a step that loads pays beyond the copy curve, once (the profile's fit)."""
    return cost_model.hw.host_load_step_s.get(mechanism, 0.0) if count else 0.0


def _beside_forward(cost_model: Any, count: int, to_device: bool,
                    mechanism: CopyMechanism) -> float:
    """Backups and prefetches: the runner issues them after the step's loads and the
    forward waits for no event of theirs, but they run beside it and slow it by the
    profile's measured cost per byte (`HardwareProfile.beside_forward`; none on a profile
    without one). The next step waits for what of their copy is left (the runner joins the
    copy stream first): their whole copy time, `copy_seconds`, is their `background`
    (kvtier/offload/__init__.py), which the simulator carries over into the next step."""
    cost = cost_model.hw.beside_forward.get(mechanism)
    if cost is None or not count:
        return 0.0
    return cost.seconds(cost_model.config.block_bytes * count, to_device)


def price_backups(cost_model: Any, count: int) -> float:
    return _beside_forward(cost_model, count, False, CopyMechanism.KERNEL_GATHER)


def price_backups_direct(cost_model: Any, count: int) -> float:
    return _beside_forward(cost_model, count, False, CopyMechanism.MEMCPY_BATCH)


def price_prefetches(cost_model: Any, count: int) -> float:
    return _beside_forward(cost_model, count, True, CopyMechanism.KERNEL_GATHER)


def price_prefetches_direct(cost_model: Any, count: int) -> float:
    return _beside_forward(cost_model, count, True, CopyMechanism.MEMCPY_BATCH)


def price_host_loads(cost_model: Any, count: int) -> float:
    return (copy_seconds(cost_model, count, to_device=True)
            + _load_step_s(cost_model, CopyMechanism.KERNEL_GATHER, count))

