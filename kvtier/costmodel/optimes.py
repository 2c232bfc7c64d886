"""Device time of each operator: the calibration's measured curve when there is one, else a
roofline (max of FLOPs over the compute ceiling and bytes over the bandwidth ceiling)
divided by a default efficiency, plus a launch floor per kernel. Bandwidth-bound kernels
without a curve of their own (the piecewise graphs' copies into their static buffers) are
priced from the measured elementwise curve: the bandwidth the layer's elementwise kernels
reached at the same token count, and their per-kernel floor.

A calibration measured on other hardware than the one simulated is transferred operator by
operator: its measured time times the ratio of the operator's rooflines on the two machines
(bandwidth-bound operators scale with bandwidth, compute-bound ones with FLOP rate).
"""

from __future__ import annotations

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import HardwareProfile, get_hardware
from kvtier.costmodel.operators import (
    Op,
    OpKind,
    Shapes,
    attn_decode,
    attn_prefill,
    layer_elementwise,
)

# Uncalibrated defaults: fractions of the roofline that tuned kernels reach on Hopper/Ampere
# at large sizes, and a per-kernel floor (launch latency + tail of a small grid).
DEFAULT_EFFICIENCY = {OpKind.GEMM: 0.75, OpKind.ATTN_DECODE: 0.7, OpKind.ATTN_PREFILL: 0.5,
                      OpKind.ELEMENTWISE: 0.6, OpKind.SAMPLE: 0.6, OpKind.ALLREDUCE: 1.0}
KERNEL_FLOOR_S = 3e-6


class OpTimer:
    def __init__(self, hw: HardwareProfile, shapes: Shapes, calib: Calibration | None):
        self.hw, self.s, self.calib = hw, shapes, calib
        self.calib_hw = get_hardware(calib.hardware) if calib is not None else hw
        self.same_hw = calib is None or self.calib_hw.name == hw.name
        self._cache: dict[tuple[str, int], float] = {}

    def roofline(self, op: Op) -> float:
        return self.hw.roofline_s(op.flops, op.bytes)

    def uncalibrated(self, op: Op) -> float:
        if op.kind is OpKind.ALLREDUCE:
            return self.allreduce(op)
        return self.roofline(op) / DEFAULT_EFFICIENCY[op.kind] + op.launches * KERNEL_FLOOR_S

    def scale(self, op: Op) -> float:
        """Calibrated time on the calibration's machine -> time on the simulated one."""
        if self.same_hw:
            return 1.0
        src = self.calib_hw.roofline_s(op.flops, op.bytes)
        return self.roofline(op) / src if src > 0 else 1.0

    def allreduce(self, op: Op) -> float:
        n = self.s.tp
        if n <= 1:
            return 0.0
        hw = self.hw
        return 2 * (n - 1) / n * op.bytes / hw.allreduce_bytes_per_s + hw.allreduce_latency_s

    def allgather(self, op: Op) -> float:
        """A ring all-gather of `op.bytes` of output: half an all-reduce's traffic."""
        n = self.s.tp
        if n <= 1:
            return 0.0
        hw = self.hw
        return (n - 1) / n * op.bytes / hw.allreduce_bytes_per_s + hw.allreduce_latency_s

    # ---- per operator class ----------------------------------------------------------------
    def keyed(self, op: Op, key: int) -> float:
        """GEMMs, elementwise and sampling: a curve over rows (cached: keys repeat)."""
        ck = (op.name, key)
        t = self._cache.get(ck)
        if t is None:
            t = self._keyed(op, key)
            self._cache[ck] = t
        return t

    def _keyed(self, op: Op, key: int) -> float:
        c = self.calib
        if c is None:
            return self.uncalibrated(op)
        if op.kind is OpKind.GEMM:
            curve = c.gemm[op.name]
        elif op.name == "layer_elementwise":
            curve = c.elementwise
        elif op.kind is OpKind.SAMPLE:
            curve = c.sample
        elif op.kind is OpKind.ELEMENTWISE:
            return self.bandwidth_bound(op, key)
        else:
            return self.uncalibrated(op)
        return curve.at(key) * self.scale(op)

    def bandwidth_bound(self, op: Op, rows: int) -> float:
        """A memory-bound kernel the profiler does not time (a copy into a piece's static
        buffer) at `rows` tokens: per launch the floor of the layer's elementwise kernels (a
        tiny kernel's time inside a graph: their time at one token over their count), and its
        bytes at the bandwidth those kernels reached at the same token count: at large token
        counts they come close to the HBM ceiling, which the uncalibrated default efficiency
        would under-rate (results/calibration/calib_h200_llama-3.1-8b.json)."""
        assert self.calib is not None
        curve = self.calib.elementwise
        ew = layer_elementwise(self.s, rows)
        floor = curve.at(1) / ew.launches
        bytes_per_s = ew.bytes / curve.at(rows)
        return (op.launches * floor + op.bytes / bytes_per_s) * self.scale(op)

    def head_elementwise(self, tokens: int, ops: list[Op]) -> float:
        if self.calib is None:
            return sum(self.uncalibrated(o) for o in ops)
        return self.calib.head_elementwise.at(tokens) * self.scale(ops[0])

    def decode_attention(self, rows: int, ctx_sum: int, graph: bool) -> float:
        op = attn_decode(self.s, rows, ctx_sum)
        if self.calib is None:
            return self.uncalibrated(op)
        grid = self.calib.attn_decode_graph if graph else self.calib.attn_decode_eager
        return grid.at(rows, ctx_sum / rows) * self.scale(op)

    def prefill_attention(self, prefills: tuple[tuple[int, int], ...]) -> float:
        op = attn_prefill(self.s, prefills)
        if self.calib is None:
            return self.uncalibrated(op)
        tokens = sum(n for n, _ in prefills)
        return self.calib.attn_prefill.seconds(op.flops, tokens) * self.scale(op)
