"""eLLM's per-step recompute budget: how many dropped-prefix tokens a step may recompute.

A dropped prefix is recomputed on every step of its request's remaining life, so dropping
pays only while the recomputation is (nearly) free. What is free is set by the step the
prefix will be paid in, which is almost always a decode step of the running requests
(most steps of the simulated ShareGPT run): b decodes put b tokens through the
weights, and on a roofline the linear layers carry extra tokens for free until the step
reaches the ridge point (bf16 FLOP/s over HBM bytes/s, a hardware profile's ceilings).

  ridge   max(0, ridge - b), in whole blocks: the roofline alone. It does not see that a
          decode step which recomputes anything leaves the full-model CUDA graph for
          piecewise graphs, a cost that weighs most at small b.
  cost    priced by the (calibrated) cost model, which does: the most whole blocks of
          prefix the decode step of b requests can recompute while its predicted time grows
          by at most `tolerance` (1 %). On the calibrated H200 that is nothing until b nears
          the ridge point.
  fixed   a token count (`max`: the engine's max_recompute_tokens).

Every rule is capped by max_recompute_tokens, which sizes the runner's recompute scratch.
The objects are tensor-free: the scheduler's policies call them in the real engine and in
the simulator alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


class StepBudget(Protocol):
    def tokens(self, num_decodes: int, decode_ctx: int) -> int:
        """Prefix tokens a step of `num_decodes` decodes of mean context `decode_ctx` may
        recompute in all (a multiple of the block size)."""
        ...


def ridge_tokens(hw) -> float:
    """Tokens a step puts through the weights before its linear layers turn compute-bound:
    2 FLOP per weight per token against 2 bytes per (bf16) weight read."""
    return hw.bf16_flops / hw.hbm_bytes_per_s


@dataclass(frozen=True)
class FixedBudget:
    num_tokens: int

    def tokens(self, num_decodes: int, decode_ctx: int) -> int:
        return self.num_tokens


@dataclass(frozen=True)
class RidgeBudget:
    ridge: float  # tokens per step (ridge_tokens)
    block_size: int
    cap: int  # max_recompute_tokens

    def tokens(self, num_decodes: int, decode_ctx: int = 0) -> int:
        free = max(0, int(self.ridge) - num_decodes)
        return min(self.cap, free // self.block_size * self.block_size)


@dataclass
class CostBudget:
    """The cost model's price; answers memoised per (decodes, context rounded down to a
    power of two: a shorter context is a shorter step, so a smaller allowance)."""

    cost_model: Any  # kvtier.costmodel.CostModel (imported lazily: policies stay light)
    block_size: int
    cap: int
    tolerance: float = 0.01
    host_groups: int = 0  # offloaded prefixes (--ellm-host-groups): priced truncated + copied
    _memo: dict[tuple[int, int], int] = field(default_factory=dict, repr=False)

    def tokens(self, num_decodes: int, decode_ctx: int) -> int:
        if num_decodes <= 0:
            return 0  # nobody decodes: nobody to drop a prefix from
        ctx = max(self.block_size, 1 << (max(1, decode_ctx).bit_length() - 1))
        key = (num_decodes, ctx)
        got = self._memo.get(key)
        if got is None:
            got = self._memo[key] = self._price(num_decodes, ctx)
        return got

    def _price(self, b: int, ctx: int) -> int:
        from kvtier.costmodel.shape import StepShape

        predict, bs = self.cost_model.predict, self.block_size
        limit = (1.0 + self.tolerance) * predict(StepShape(b, b * ctx, ctx, (), b)).total_s
        k = 0
        # One prefill row per dropped block (make_room drops a few blocks from several
        # requests). Stop at the first block past the limit: the price is not monotone
        # (padded graph sizes), and a budget must hold for every load below it.
        h = self.host_groups
        while k + bs <= self.cap:
            rows = ((bs, 0),) * ((k + bs) // bs)
            shape = StepShape(b, b * ctx, ctx, rows, b, num_prefix_rows=len(rows) if h else 0,
                              prefix_host_groups=h, num_prefix_copy_blocks=h * len(rows))
            if predict(shape).total_s > limit:
                break
            k += bs
        return k
