"""NEO's per-step choice of how a step with CPU decodes runs (torch-free). NEO's scheduler
(NEO-MLSys25/NEO, swiftllm/server/scheduler.py, `_decide_mode_and_gen_batch`) builds a
pipelined pair of sub-batches within its rule and a GPU-only batch that leaves the CPU
decodes out, and runs whichever has the better predicted rate (requests a second). kvtier
also has the sequential way (one batch, the CPU attention waited for in place); it competes
by the same predicted rate:

    rate(GPU-only) = n0 / T_gpu_only,   rate(pipelined | sequential) = (n0 + n1) / T

n0: batch 0's rows, n1: the CPU decodes; times from neo/steps.py's prices (kvtier's cost
model, calibrated when given one). Pipelining is offered only where NEO's rule holds
(neo/pipeline.py). Like NEO's batch forming, a step may also leave out only some CPU
decodes (`best_hold`: the leading ones, by the same rates; all of them is the GPU-only
step), never one that has sat out `max_skipped_steps` steps in a row (so none starves).

Before scheduling (GPU-only or not: the left-out rows must not be scheduled) the step's
shape is forecast from the running requests and the waiting ones the free device blocks
admit; once scheduled, the rows' exact shape picks pipelined or sequential.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from kvtier.core.request import Request
from kvtier.costmodel.shape import StepShape
from kvtier.kv.manager import cdiv
from kvtier.policies.host_resident.step_tokens import StepTokens
from kvtier.policies.neo.pipeline import PipelineRule
from kvtier.policies.neo.steps import StepMode, StepPrices, batch0


@dataclass(frozen=True)
class ModeChoice:
    prices: StepPrices
    rule: PipelineRule

    def best(self, shape: StepShape, num_rows: int, host_tokens: int,
             gpu_only: bool) -> StepMode:
        """The way of the best predicted rate among those allowed (ties: the first of
        pipelined, sequential, GPU-only)."""
        rates = self.rates(shape, num_rows, host_tokens, gpu_only)
        return max(rates, key=rates.__getitem__)  # max keeps the first of equal rates

    def rates(self, shape: StepShape, num_rows: int, host_tokens: int, gpu_only: bool,
              pipelines: bool | None = None) -> dict[StepMode, float]:
        """Each allowed way's predicted rate (requests a second), in the order ties go:
        pipelined (where NEO's rule holds; `pipelines` when the caller has checked it),
        sequential, GPU-only (when asked for and batch 0 has rows)."""
        if pipelines is None:
            pipelines = self.rule.holds(shape, num_rows, host_tokens)
        modes = [StepMode.PIPELINED] if pipelines else []
        modes.append(StepMode.SEQUENTIAL)
        rows = shape.num_reqs
        if gpu_only and rows > num_rows:
            modes.append(StepMode.GPU_ONLY)
        return {m: (rows - num_rows if m is StepMode.GPU_ONLY else rows)
                / self.prices.seconds(shape, num_rows, host_tokens, m) for m in modes}

    def best_hold(self, shape: StepShape, host_ctx: Sequence[int], max_held: int) -> int:
        """How many of the leading CPU decodes (contexts `host_ctx`, in the step's order)
        sit this step out, at most `max_held`: the count of the best predicted rate, the
        rest run the best way they may (all held: a GPU-only step). NEO's scheduler adds
        CPU decodes to the pipelined batch 1 one by one while its rule holds; so a count
        between none and all is a candidate only where the rest pipeline, and the counts
        are weighed by the same rates as the ways of running, in at most HOLD_CANDIDATES
        evenly spaced counts (the policy prices them every step). Ties keep the fewest
        held."""
        n, total = len(host_ctx), sum(host_ctx)
        held_tokens = list(accumulate(host_ctx, initial=0))
        gpu_b0 = self.rule.batch0_s(shape, n, total)  # batch 0 is the same at every count
        best_k, best_rate = 0, -1.0
        for k in hold_candidates(max_held):
            step = batch0(shape, k, held_tokens[k])
            if not step.num_reqs:
                continue
            rows, tokens = n - k, total - held_tokens[k]
            if not rows:  # all held: the GPU-only step
                rate = step.num_reqs / self.prices.seconds(step, 0, 0, StepMode.GPU_ONLY)
            elif 0 < k:  # NEO leaves out only the CPU decodes that would break its rule
                if not self.rule.holds_beside(gpu_b0, rows, tokens):
                    continue
                rates = self.rates(step, rows, tokens, gpu_only=False, pipelines=True)
                if rates[StepMode.PIPELINED] < rates[StepMode.SEQUENTIAL]:
                    continue
                rate = rates[StepMode.PIPELINED]
            else:
                pipelines = self.rule.holds_beside(gpu_b0, rows, tokens)
                rate = max(self.rates(step, rows, tokens, False, pipelines).values())
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k


HOLD_CANDIDATES = 9  # counts of held CPU decodes priced a step: 0, all, and between


def hold_candidates(max_held: int) -> list[int]:
    """0..max_held, or HOLD_CANDIDATES of them evenly spaced (0 and max_held included)."""
    if max_held < HOLD_CANDIDATES:
        return list(range(max_held + 1))
    last = HOLD_CANDIDATES - 1
    return sorted({round(i * max_held / last) for i in range(HOLD_CANDIDATES)})


def forecast(running: Sequence[Request], host: Collection[str], waiting: Iterable[Request],
             step: StepTokens, spare_blocks: int, block_size: int, num_groups: int,
             seats: int | None = None) -> tuple[StepShape, tuple[int, ...]]:
    """(the step's shape, its CPU decodes' contexts in order) as the scheduler will
    likely make it: running requests in order within `step`'s token budget and prefill
    chunks, then waiting prompts while the budget, `spare_blocks` free device blocks and
    the `seats` (max_num_seqs: rows a step, running ones included) last.
    Host-running requests lead `running`."""
    host_ctx: list[int] = []
    decodes: list[int] = []
    prefills: list[tuple[int, int]] = []
    sampled = 0
    for req, n, remaining in step.running(running):
        if remaining <= 1:
            ctx = req.num_computed_tokens + 1
            decodes.append(ctx)
            if req.request_id in host:
                host_ctx.append(ctx)
        else:
            prefills.append((n, req.num_computed_tokens))
        sampled += n == remaining
    free_seats = None if seats is None else seats - len(running)
    for req in waiting:
        if free_seats is not None:
            if free_seats <= 0:
                break
            free_seats -= 1
        n = step.admit(req)
        need = num_groups * cdiv(req.num_computed_tokens + n, block_size)
        if not n or need > spare_blocks:
            break
        prefills.append((n, req.num_computed_tokens))
        sampled += n == req.num_tokens - req.num_computed_tokens
        spare_blocks -= need
    shape = StepShape(num_decodes=len(decodes), decode_ctx_sum=sum(decodes),
                      decode_ctx_max=max(decodes, default=0), prefills=tuple(prefills),
                      num_sampled=sampled)
    return shape, tuple(host_ctx)
