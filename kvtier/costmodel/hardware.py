"""Hardware profiles: the ceilings a roofline divides by, and the cost of each copy mechanism.

The H200 figures are the reference machine's measurements (`shared/hw/h200_probe_2026-11-30`,
copied here so the cost model has no run-time dependency on that folder); the A100 figures
and the T4, A10G and H100 SXM ones are datasheet values for the GPUs the seed papers
evaluated on (docs/RESULTS.md says which); none of those has been measured by us.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

GiB = 1 << 30


class CopyMechanism(str, enum.Enum):
    """How KV pages cross the host-device link."""

    BULK = "bulk"  # one large cudaMemcpyAsync over contiguous pinned memory
    MEMCPY_PER_PAGE = "memcpy_per_page"  # one cudaMemcpyAsync per page
    MEMCPY_BATCH = "memcpy_batch"  # every page in one cudaMemcpyBatchAsync
    KERNEL_GATHER = "kernel_gather"  # a kernel reads pinned host pages through UVA


@dataclass(frozen=True)
class CopyCost:
    """Time of one transfer of `n` bytes: alpha * n + beta (beta is paid per transfer: per
    page for MEMCPY_PER_PAGE, per launch for BULK and KERNEL_GATHER)."""

    alpha_s_per_byte: float
    beta_s: float

    def seconds(self, num_bytes: float, num_transfers: int = 1) -> float:
        return self.alpha_s_per_byte * num_bytes + self.beta_s * num_transfers


class HostAttention(str, enum.Enum):
    """How a step attends over decode rows whose KV lives in host memory."""

    CPU_ROUND_TRIP = "cpu_round_trip"  # the CPU attends; per layer q/k/v go down, the output up
    # The same inside a replayed decode graph: one CPU job a step follows the layers through
    # pinned flags (no Python between them); the profile's round trip where not fitted.
    CPU_GRAPH = "cpu_graph"
    ZERO_COPY = "zero_copy"  # a GPU kernel reads the pinned host pages in place (UVA)


@dataclass(frozen=True)
class HostAttentionCost:
    """A step's attention over its host rows: a fixed cost per layer, paid once a step
    however few rows there are (the round trip's copies and waits, the kernel's launch, the
    forward no longer replaying a whole-model graph), plus the rows' KV bytes at a rate."""

    layer_s: float
    bytes_per_s: float
    # A step whose host rows also attend a device suffix each (their oldest blocks alone on
    # the host) pays this much more per layer: the suffix's read and the two parts' merge.
    split_layer_s: float = 0.0

    def seconds(self, num_bytes: float, num_layers: int) -> float:
        return num_layers * self.layer_s + num_bytes / self.bytes_per_s


# KV bytes a second a CPU decode attention reads on the H200 host's 16 cores (torch's SDPA
# there; shared/research/seed002_implementation_notes.md); every profile's host side.
CPU_ATTENTION_BYTES_PER_S = 35e9


@dataclass(frozen=True)
class BesideForward:
    """What a copy running beside a forward adds to that forward's time, per byte it moves
    each way: the copy holds no stream the forward waits on, but shares the GPU with it (a
    kernel's SMs and memory traffic; the copy engine's queue with the forward's own uploads)."""

    h2d_s_per_byte: float = 0.0
    d2h_s_per_byte: float = 0.0

    def seconds(self, num_bytes: int, to_device: bool) -> float:
        return num_bytes * (self.h2d_s_per_byte if to_device else self.d2h_s_per_byte)


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_bytes: int  # what torch reports as the device's total memory
    hbm_bytes_per_s: float  # device copy bandwidth, read + write counted
    bf16_flops: float  # dense bf16 matrix rate
    num_sms: int
    h2d: dict[CopyMechanism, CopyCost] = field(default_factory=dict)
    d2h: dict[CopyMechanism, CopyCost] = field(default_factory=dict)
    # Tensor parallelism: ring all-reduce moves 2(n-1)/n of the bytes over this bus bandwidth.
    allreduce_bytes_per_s: float = 0.0
    allreduce_latency_s: float = 0.0
    measured: bool = False  # False: datasheet figures, never checked on the machine
    # Fitted host-row attention costs; a mechanism absent here is priced from the copies.
    host_attention: dict[HostAttention, HostAttentionCost] = field(default_factory=dict)
    # A step that loads host-tier pages pays this once per mechanism beyond the copy curve
    # (staging, the layer groups' events, the forward's waits on the copy stream); fitted
    # end to end, absent (0) on a profile never measured.
    host_load_step_s: dict[CopyMechanism, float] = field(default_factory=dict)
    # A host-tier copy no layer waits for (a backup, a prefetch) slows the forward beside it
    # by this much per byte; fitted, absent (nothing) on a profile never measured.
    beside_forward: dict[CopyMechanism, BesideForward] = field(default_factory=dict)

    def host_attention_cost(self, mechanism: HostAttention) -> HostAttentionCost:
        """The fitted cost, else the bytes at the mechanism's rate: zero-copy reads at the
        UVA gather's, one launch a layer; the CPU at its read rate, two small copies a layer."""
        fitted = self.host_attention.get(mechanism)
        if fitted is not None:
            return fitted
        if mechanism is HostAttention.CPU_GRAPH:
            return self.host_attention_cost(HostAttention.CPU_ROUND_TRIP)
        if mechanism is HostAttention.ZERO_COPY:
            gather = self.h2d[CopyMechanism.KERNEL_GATHER]
            return HostAttentionCost(gather.beta_s, 1 / gather.alpha_s_per_byte)
        return HostAttentionCost(2 * self.d2h[CopyMechanism.BULK].beta_s,
                                 CPU_ATTENTION_BYTES_PER_S)

    def roofline_s(self, flops: float, num_bytes: float) -> float:
        return max(flops / self.bf16_flops, num_bytes / self.hbm_bytes_per_s)


def _h200() -> HardwareProfile:
    # PCIe Gen5 x16, pinned memory. Bulk copies' rates, the per-page call's cost (a 32 KiB
    # page's time less its bytes: the driver's per-call cost dominates) and the UVA gather
    # kernel's rate come from the hw probe (shared/hw/h200_probe_2026-11-30.json); the batch
    # call's from results/kernels/host_page_io_h200_runtime.json (its rate: the link's in
    # that run; its per-page cost: the host time of a 1,024-page list, alone).
    h2d = {
        CopyMechanism.BULK: CopyCost(1 / 55.35e9, 10e-6),
        CopyMechanism.MEMCPY_PER_PAGE: CopyCost(1 / 55.35e9, 7.4e-6),
        CopyMechanism.MEMCPY_BATCH: CopyCost(1 / 54.31e9, 1.2e-6),
        CopyMechanism.KERNEL_GATHER: CopyCost(1 / 49.44e9, 5e-6),
    }
    d2h = {
        CopyMechanism.BULK: CopyCost(1 / 54.87e9, 10e-6),
        CopyMechanism.MEMCPY_PER_PAGE: CopyCost(1 / 54.87e9, 7.4e-6),
        CopyMechanism.MEMCPY_BATCH: CopyCost(1 / 55.19e9, 1.2e-6),
        CopyMechanism.KERNEL_GATHER: CopyCost(1 / 49.44e9, 5e-6),
    }
    return HardwareProfile(
        name="h200", memory_bytes=int(139.80072021484375 * GiB), hbm_bytes_per_s=4.24e12,
        bf16_flops=761e12, num_sms=132, h2d=h2d, d2h=d2h,
        # NVLink 4 (H200 SXM): the datasheet's rate each way times NCCL's typical ring
        # efficiency. Not measured here (no multi-GPU machine was lent).
        allreduce_bytes_per_s=360e9, allreduce_latency_s=10e-6, measured=True,
        # Fit from the host-resident runs: results/calibration/host_rows_h200.json (the
        # graph steps' since the CPU layer calls leave two cores; the round trip's before).
        host_attention={HostAttention.CPU_ROUND_TRIP: HostAttentionCost(0.781e-3, 85.21e9),
                        HostAttention.CPU_GRAPH: HostAttentionCost(0.0615e-3, 60.18e9),
                        HostAttention.ZERO_COPY: HostAttentionCost(0.0494e-3, 54.99e9,
                                                                   split_layer_s=0.0746e-3)},
        # Fit from the measured break-even: results/calibration/host_loads_h200.json.
        host_load_step_s={CopyMechanism.KERNEL_GATHER: 0.955e-3,
                          CopyMechanism.MEMCPY_BATCH: 2.19e-3},
        # Fit beside the engine's 8K prefill (two runs' mean):
        # results/calibration/beside_forward_h200.json.
        beside_forward={CopyMechanism.KERNEL_GATHER: BesideForward(2.777e-12, 2.882e-12),
                        CopyMechanism.MEMCPY_BATCH: BesideForward(17.72e-12, 1.811e-12)},
    )


def _a100_80gb_pcie() -> HardwareProfile:
    # Datasheet values (HBM2e, dense bf16, SMs); copies at PCIe Gen4 x16's effective rate for
    # pinned memory. Per-page cost as on the H200 (a driver cost, not a link one).
    pcie = 25e9
    return HardwareProfile(
        name="a100-80gb-pcie", memory_bytes=int(79.25 * GiB), hbm_bytes_per_s=1.935e12,
        bf16_flops=312e12, num_sms=108, h2d=_pcie_copies(pcie), d2h=_pcie_copies(pcie),
        # PCIe cards without NVLink bridges all-reduce through the host link.
        allreduce_bytes_per_s=0.8 * pcie, allreduce_latency_s=20e-6, measured=False,
    )


def _pcie_copies(link_bytes_per_s: float) -> dict[CopyMechanism, CopyCost]:
    # A datasheet link's copies: the per-page and per-launch costs are the driver's and the
    # kernel's, as measured on the H200, the byte rates the link's.
    return {
        CopyMechanism.BULK: CopyCost(1 / link_bytes_per_s, 10e-6),
        CopyMechanism.MEMCPY_PER_PAGE: CopyCost(1 / link_bytes_per_s, 7.4e-6),
        CopyMechanism.KERNEL_GATHER: CopyCost(1 / (0.9 * link_bytes_per_s), 5e-6),
    }


def _t4() -> HardwareProfile:
    # NVIDIA T4 datasheet (GDDR6, 40 SMs, mixed-precision FP16 tensor rate: Turing has no
    # bf16, so the fp16 rate stands in); memory as nvidia-smi reports it with ECC on. PCIe
    # Gen3 x16 at its effective pinned rate.
    pcie = 12e9
    return HardwareProfile(
        name="t4", memory_bytes=15360 * (1 << 20), hbm_bytes_per_s=320e9, bf16_flops=65e12,
        num_sms=40, h2d=_pcie_copies(pcie), d2h=_pcie_copies(pcie),
        allreduce_bytes_per_s=0.8 * pcie, allreduce_latency_s=20e-6, measured=False,
    )


def _a10g() -> HardwareProfile:
    # NVIDIA A10 datasheet's GDDR6 bandwidth and dense bf16 tensor rate (NVIDIA publishes no
    # A10G sheet; AWS's G5 page gives its 24 GB and the GA102's 80 SMs); memory as
    # nvidia-smi reports it. PCIe Gen4 x16 as the A100 profile's.
    pcie = 25e9
    return HardwareProfile(
        name="a10g", memory_bytes=23028 * (1 << 20), hbm_bytes_per_s=600e9, bf16_flops=125e12,
        num_sms=80, h2d=_pcie_copies(pcie), d2h=_pcie_copies(pcie),
        allreduce_bytes_per_s=0.8 * pcie, allreduce_latency_s=20e-6, measured=False,
    )


def _h100_sxm() -> HardwareProfile:
    # NVIDIA H100 datasheet, SXM5 80GB column (HBM3, dense bf16, 132 SMs); memory as
    # nvidia-smi reports it. PCIe Gen5 x16 at the H200 probe's bulk rate (the same link).
    pcie = 55e9
    return HardwareProfile(
        name="h100-sxm", memory_bytes=81559 * (1 << 20), hbm_bytes_per_s=3.35e12,
        bf16_flops=989e12, num_sms=132, h2d=_pcie_copies(pcie), d2h=_pcie_copies(pcie),
        # NVLink 4, priced as the H200 profile's (same fabric).
        allreduce_bytes_per_s=360e9, allreduce_latency_s=10e-6, measured=False,
    )


HARDWARE: dict[str, HardwareProfile] = {
    p.name: p for p in (_h200(), _a100_80gb_pcie(), _t4(), _a10g(), _h100_sxm())}
_ALIASES = {"a100": "a100-80gb-pcie", "a100-80gb": "a100-80gb-pcie", "nvidia-h200": "h200",
            "h100": "h100-sxm", "nvidia-t4": "t4", "nvidia-a10g": "a10g"}


def get_hardware(name: str) -> HardwareProfile:
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in HARDWARE:
        raise ValueError(f"unknown hardware {name!r}; known: {', '.join(sorted(HARDWARE))}"
                         f" (aliases: {', '.join(sorted(_ALIASES))})")
    return HARDWARE[key]


def hardware_names() -> list[str]:
    return sorted([*HARDWARE, *_ALIASES])
