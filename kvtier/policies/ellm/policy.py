"""eLLM adaptive KV caching (EuroSys'26): token-partial caching with exact recomputation.

A running request of n tokens may keep KV only for tokens [s, n); its prefix [0, s) is
recomputed every step, through every layer, from its token ids (the prefix depends on
nothing after it, so this is exact). The uncached ratio r = s / n trades compute for memory:

  * fixed mode (`uncached_ratio=r`): every request in decode keeps ~(1-r) of its KV — the
    paper's cache-ratio sweep;
  * planned mode (`planner`): the request-level planner (SLSQP over the batch size and r,
    kvtier/policies/ellm/planner/request_level.py) re-chooses r from the running requests' contexts every
    `replan_every` steps, and every request is brought to it as in fixed mode;
  * adaptive mode (default): prefixes are dropped only when blocks run out, from the
    requests holding the most KV, each up to `max_uncached_ratio`, and only while every
    dropped prefix together stays within the step's recompute budget
    (`EllmOptions.step_budget`: what a decode step of the running requests recomputes
    about free — the ridge point minus its decodes, or the cost model's price; a dropped
    prefix is paid on every later step, so anything past it costs more than the preemption
    it saves); only when that cannot free enough does the scheduler preempt (recompute
    mode, as vLLM V1).
Whole token blocks are dropped, in every layer group at once, and the last (partial) block
is always kept. Fixed and planned modes recompute up to `max_recompute_tokens` a step.
"""

from __future__ import annotations

from collections.abc import Iterable

from kvtier.config import SystemOptions
from kvtier.core.request import Request
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import KVPolicy, Preemption, drop_kv
from kvtier.policies.ellm.options import EllmOptions, ellm_options


def _in_decode(req: Request) -> bool:
    return req.num_computed_tokens >= req.num_prompt_tokens


class EllmPolicy(KVPolicy):
    options: EllmOptions

    def __init__(self, options: SystemOptions):
        super().__init__(ellm_options(options))
        self._steps = 0
        self._planned_ratio: float | None = None
        self.num_dropped_blocks = 0  # token blocks whose device KV was dropped, all steps

    def target_ratio(self, running: list[Request], waiting: Iterable[Request]) -> float | None:
        """The uncached ratio every request is brought to this step (None: on demand only).
        The planner sees the requests that could run: running ones, then the waiting."""
        if self.options.planner is None:
            return self.options.uncached_ratio
        if self._steps % self.options.replan_every == 0 and running:
            contexts = [r.num_tokens for r in running] + [r.num_tokens for r in waiting]
            decision = self.options.planner.solve(contexts)
            self._planned_ratio = min(decision.uncached_ratio, self.options.max_uncached_ratio)
        self._steps += 1
        return self._planned_ratio

    def _on_demand_cap(self) -> float:
        """How far make_room may drop a request: the planner's or the fixed ratio when one
        is set (they are what every request should keep), else max_uncached_ratio."""
        if self.options.planner is not None:
            return self._planned_ratio or 0.0
        if self.options.uncached_ratio is not None:
            return self.options.uncached_ratio
        return self.options.max_uncached_ratio

    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        return drop_kv(req, kv)

    def _cap_blocks(self, req: Request, kv: KVCacheManager, ratio: float) -> int:
        """Token blocks of `req` that may be dropped at uncached ratio `ratio`."""
        full_blocks = (req.num_computed_tokens - 1) // kv.block_size  # keep the last block
        return max(0, min(full_blocks, int(ratio * req.num_computed_tokens) // kv.block_size))

    def _recompute_load(self, running: list[Request], kv: KVCacheManager) -> int:
        return sum(kv.num_dropped_tokens(r) for r in running)

    def step_budget(self, running: list[Request]) -> int:
        """Prefix tokens the running requests may recompute per step in all: in adaptive
        mode what a decode step of them recomputes about free, at most max_recompute_tokens
        (the runner's scratch holds no more)."""
        cap, rule = self.options.max_recompute_tokens, self.options.step_budget
        if rule is None or not self.options.adaptive:
            return cap
        num_decodes = ctx_sum = 0
        for req in running:
            if _in_decode(req):
                num_decodes += 1
                ctx_sum += req.num_computed_tokens
        return min(cap, rule.tokens(num_decodes, ctx_sum // max(1, num_decodes)))

    def before_step(self, running: list[Request], kv: KVCacheManager,
                    waiting: Iterable[Request] = ()) -> None:
        r = self.target_ratio(running, waiting)
        if not r:
            return
        # Within the per-step recompute budget (the runner's scratch holds no more).
        budget = self.options.max_recompute_tokens - self._recompute_load(running, kv)
        for req in running:
            if not _in_decode(req):
                continue
            have = kv.num_dropped_tokens(req) // kv.block_size
            extra = min(self._cap_blocks(req, kv, r) - have, budget // kv.block_size)
            if extra > 0:
                self._drop(req, kv, have + extra)
                budget -= extra * kv.block_size

    @staticmethod
    def _blocks_to_drop(req: Request, kv: KVCacheManager, have: int, most: int,
                        num_blocks: int) -> tuple[int, int]:
        """(Token blocks past the `have` dropped ones to drop, up to `most`, device blocks
        that frees): the fewest that free `num_blocks`, else as many as free anything. A
        block another request shares (a prefix cache hit) frees nothing: it is dropped only
        to reach the request's own blocks behind it, never at the end."""
        extra = gain = freed = 0
        for i, released in enumerate(kv.releasable_blocks(req, have, have + max(0, most))):
            freed += released
            if released:
                extra, gain = i + 1, freed
            if gain >= num_blocks:
                break
        return extra, gain

    def make_room(self, running: list[Request], kv: KVCacheManager, num_blocks: int) -> bool:
        budget = self.step_budget(running)
        if budget < kv.block_size:
            return False  # nothing is free: the scheduler preempts instead
        budget -= self._recompute_load(running, kv)
        # The requests holding the most device KV give first: each dropped block is worth
        # the same memory, and a long request's prefix is a smaller share of its attention.
        # All or nothing: drops that do not spare the preemption would be paid every step
        # for nothing.
        drops: list[tuple[Request, int]] = []
        freed = 0
        for req in sorted(running, key=lambda r: -r.num_computed_tokens):
            if freed >= num_blocks or budget < kv.block_size:
                break
            if not _in_decode(req):
                continue
            have = kv.num_dropped_tokens(req) // kv.block_size
            most = min(self._cap_blocks(req, kv, self._on_demand_cap()) - have,
                       budget // kv.block_size)
            extra, gain = self._blocks_to_drop(req, kv, have, most, num_blocks - freed)
            if not extra:
                continue
            drops.append((req, have + extra))
            freed += gain
            budget -= extra * kv.block_size
        if freed < num_blocks:
            return False
        for req, num_token_blocks in drops:
            self._drop(req, kv, num_token_blocks)
        return True

    def _drop(self, req: Request, kv: KVCacheManager, num_token_blocks: int) -> None:
        """Drop the device KV of req's first `num_token_blocks` token blocks, counted."""
        self.num_dropped_blocks += num_token_blocks - kv.num_dropped_tokens(req) // kv.block_size
        kv.drop_prefix(req, num_token_blocks)
