"""eLLM's layer-level overlap: which layer groups of a dropped prefix come back from the
host pool each step and which are recomputed, chosen so that the two take the same time.

With G groups of F layers and the top h groups' prefix KV kept in the host pool, a step
recomputes the prefix's s tokens through the lower (G - h) * F layers (prefill-sized rows:
compute-bound) while the copy stream brings the upper groups' KV over PCIe, one copy per
token block and group; group g's attention waits for its own copy, and the upper groups
come after the lower ones, so the copies have the lower groups' compute to hide behind:

    recompute(h) = s * 2 * P_layer * F * (G - h) / bf16 FLOP/s
    copy(h)      = s * KV_layer * F * h / PCIe B/s  +  h * ceil(s / B) * beta
    bubble(h)    = max(0, copy(h) - recompute(h))      (what the copies leave exposed)

The step pays about max(recompute, copy) for the prefix: the paper picks, among its
configurations, the one whose two times match, which is where that maximum is smallest.
Both grow linearly in s apart from the per-copy beta, so the choice barely depends on s.
Tensor-free: the builder and the simulator can both ask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvtier.config import ModelConfig
from kvtier.costmodel.hardware import CopyMechanism, HardwareProfile
from kvtier.costmodel.shape import StepShape


@dataclass(frozen=True)
class OverlapConfig:
    host_groups: int  # top layer groups copied in; the rest are recomputed
    recompute_s: float
    copy_s: float

    @property
    def step_s(self) -> float:
        return max(self.recompute_s, self.copy_s)

    @property
    def bubble_s(self) -> float:
        return max(0.0, self.copy_s - self.recompute_s)


def layer_params(mc: ModelConfig) -> int:
    h = mc.hidden_size
    return h * (mc.q_size + 2 * mc.kv_size) + mc.q_size * h + 3 * h * mc.intermediate_size


def overlap_configs(mc: ModelConfig, hw: HardwareProfile, layers_per_block: int,
                    prefix_tokens: int, block_size: int = 16,
                    dtype_bytes: int = 2) -> list[OverlapConfig]:
    """Every split h = 0 .. G-1 (at least the first group recomputes: its KV needs only the
    token ids, the others' copies need something to hide behind)."""
    f = min(layers_per_block, mc.num_layers)
    groups = -(-mc.num_layers // f)
    recompute_per_layer = prefix_tokens * 2 * layer_params(mc) / hw.bf16_flops
    kv_layer_bytes = prefix_tokens * 2 * mc.kv_size * dtype_bytes
    link = hw.h2d[CopyMechanism.BULK]
    blocks = -(-prefix_tokens // block_size)
    out = []
    for h in range(groups):
        copy = link.seconds(kv_layer_bytes * f * h, h * blocks) if h else 0.0
        out.append(OverlapConfig(h, recompute_per_layer * f * (groups - h), copy))
    return out


def choose_host_groups(mc: ModelConfig, hw: HardwareProfile, layers_per_block: int,
                       prefix_tokens: int = 256, block_size: int = 16) -> OverlapConfig:
    """The split whose recompute and copy times match best: the smallest max of the two."""
    return min(overlap_configs(mc, hw, layers_per_block, prefix_tokens, block_size),
               key=lambda c: (c.step_s, c.host_groups))


def choose_host_groups_priced(cost_model: Any, num_groups: int, prefix_tokens: int = 256,
                              num_decodes: int = 64, decode_ctx: int = 400,
                              block_size: int = 16) -> int:
    """The same choice priced by the (calibrated) cost model on a representative step, a
    prefix of `prefix_tokens` beside `num_decodes` decodes at `decode_ctx`: the split with
    the cheapest predicted step, which is where the overlapped copies and the remaining
    recompute balance (the roofline above prices GEMMs at the peak, which makes copying look
    dearer than it is)."""
    blocks = -(-prefix_tokens // block_size)

    def step_s(h: int) -> float:
        shape = StepShape(num_decodes, num_decodes * decode_ctx, decode_ctx,
                          ((prefix_tokens, 0),), num_decodes, num_prefix_rows=1 if h else 0,
                          prefix_host_groups=h, num_prefix_copy_blocks=h * blocks)
        return float(cost_model.predict(shape).executor_s)

    return min(range(num_groups), key=lambda h: (step_s(h), h))
