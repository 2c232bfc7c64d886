"""A priced limit on the placement's moves (torch-free: the scheduler side decides, the
simulator runs it too). When the device pool is short, the placement moves the newest
device-resident decodes to the host (placement.py); the balance asks, candidate by
candidate, whether the move pays by the system's own rule, and a move it refuses is not
made: the pool stays short and the scheduler preempts as usual (recompute).

The step's sums (StepSums) are what every rule prices from: the host rows' context tokens
(the host-running decodes and the candidates moved so far), the device-resident decodes'
contexts, and the running prefills' chunks within the token budget. Two rules:

  * hidden_under_gpu (NEO, kvtier/policies/neo/balance.py): the host rows' attention runs
    beside the GPU's work and must stay hidden under it,

        T_host(host rows, the mover included) <= factor * T_gpu(step)

  * cheaper_than_recompute (DirectKV, kvtier/policies/directkv/): the host rows' reads are
    on the step's path, so every request of the batch waits for them. Hosting the mover
    adds to every step it still runs, at most its remaining tokens R, what its host row
    adds to the step (the per-layer fixed cost too, when it is the first host row); the
    alternative, preempting it, costs the recompute of its context once:

        R * (T_host(host rows + mover) - T_host(host rows)) <= factor * T_prefill(context)

    (a row moved part by part, under partial moves, counts all of its host tokens as the
    mover's: preempting the row is the alternative to every part of it)

    R bounds the steps from above (the request may come back before its end), so the rule
    errs towards preempting; a move refused costs at most one recompute, a move allowed
    that does not pay slows the whole batch for as long as it stays.

factor 0 lifts the limit (every overflowing decode moves).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtier.core.request import Request
from kvtier.costmodel.shape import StepShape
from kvtier.policies.host_resident.step_tokens import StepLimits, StepTokens

RowsPrice = Callable[[Any, int], float]  # (cost model, host context tokens) -> seconds


def last_token(req: Request, max_model_len: int = 0) -> int:
    """How many tokens the request holds at its end: prompt + max_tokens, at most
    max_model_len (0: no cap)."""
    end = req.num_prompt_tokens + req.max_tokens
    return min(end, max_model_len) if max_model_len else end


def forward_s(cost_model: Any, shape: StepShape) -> float:
    """The forward's seconds of a step of this shape (its GPU work, without sampling)."""
    cost = cost_model.predict(shape)
    return cost.parts.get("forward", cost.executor_s)


class StepSums:
    """One step's rows as the balance prices them, updated as candidates move."""

    def __init__(self, running: Sequence[Request], host: Collection[str],
                 step: StepTokens, host_prefix: Mapping[str, int] | None = None):
        """`step`: the scheduler's handing out of the step's tokens, which gives the
        prefills their chunks (every decode is counted: the movers, the newest, are among
        them); `host_prefix`: host tokens of the host rows that keep a device suffix (the
        others hold their whole context on the host)."""
        prefix = host_prefix or {}
        self.host_rows = self.host_tokens = self.gpu_rows = self.gpu_ctx_sum = 0
        self.gpu_ctx_max = self.split_rows = 0
        chunks = {req: n for req, n, remaining in step.running(running) if remaining > 1}
        prefills = []
        for req in running:
            if req.num_tokens + req.num_pending_tokens - req.num_computed_tokens > 1:
                if req in chunks:  # a prefill: its chunk this step
                    prefills.append((chunks[req], req.num_computed_tokens))
                continue
            ctx = req.num_computed_tokens + 1
            if req.request_id in host:
                on_host = min(ctx, prefix.get(req.request_id, ctx))
                self.host_rows, self.host_tokens = self.host_rows + 1, self.host_tokens + on_host
                self.gpu_ctx_sum += ctx - on_host  # a device suffix: attended on the GPU
                self.split_rows += on_host < ctx
            else:
                self.gpu_rows, self.gpu_ctx_sum = self.gpu_rows + 1, self.gpu_ctx_sum + ctx
                self.gpu_ctx_max = max(self.gpu_ctx_max, ctx)
        self.prefills = tuple(prefills)

    def move(self, tokens: int, new_row: bool = True) -> None:
        """`tokens` of a decode's context move to the host; `new_row`: it was a device row."""
        self.host_tokens += tokens
        self.gpu_ctx_sum -= tokens
        if new_row:
            self.host_rows, self.gpu_rows = self.host_rows + 1, self.gpu_rows - 1

    def gpu_s(self, cost_model: Any, moved_ctx: int) -> float:
        """The step's GPU forward once a decode of context `moved_ctx` has moved: a host
        row still runs the linear layers on the GPU (priced as a decode of context 1)."""
        rows = self.host_rows + 1
        shape = StepShape(num_decodes=self.gpu_rows - 1 + rows,
                          decode_ctx_sum=max(0, self.gpu_ctx_sum - moved_ctx) + rows,
                          decode_ctx_max=self.gpu_ctx_max, prefills=self.prefills)
        return forward_s(cost_model, shape)


@dataclass(frozen=True)
class HostBalance:
    """A system's limit on the moves: `pays(balance, sums, candidate)` is its rule."""

    cost_model: Any  # kvtier.costmodel.CostModel
    price_rows: RowsPrice  # the system's price of its host rows
    factor: float = 1.0
    step: StepLimits = StepLimits()  # the scheduler's: they cap a prefill's chunk
    max_model_len: int = 0  # a request's last token (0: its prompt + max_tokens)
    pays: Callable[[HostBalance, StepSums, Request, int, int], bool] = field(kw_only=True)
    # The system's price of a step whose host rows keep device suffixes ((cost model, rows)
    # -> seconds), or None: its rows are never split.
    price_split: Callable[[Any, int], float] | None = field(default=None, kw_only=True)

    def mover(self, running: Sequence[Request], host: Collection[str],
              host_prefix: Mapping[str, int] | None = None
              ) -> Callable[[Request, int | None, int | None], bool]:
        """A check for this step's candidates, taken in order, each with the tokens it would
        move (None: its whole context still on the device) and those its price assumes it
        moves (None: the same): True (and counted on the host side from then on) when the
        candidate may move. `host_prefix` as StepSums'."""
        prefix = dict(host_prefix or {})
        sums = StepSums(running, host, self.step.start(), prefix)
        rows = set(host)

        def may_move(req: Request, tokens: int | None = None, priced: int | None = None) -> bool:
            rid, ctx = req.request_id, req.num_computed_tokens + 1
            on_host = min(ctx, prefix.get(rid, ctx)) if rid in rows else 0
            moved = ctx - on_host if tokens is None else tokens
            cost = moved if priced is None else min(priced, ctx - on_host)
            if self.factor > 0 and not self.pays(self, sums, req, cost, on_host):
                return False
            sums.move(moved, new_row=rid not in rows)
            if on_host == 0 and moved < ctx:  # a device row split by this move
                sums.split_rows += 1
            rows.add(rid)
            prefix[rid] = on_host + moved
            return True
        return may_move

    def split_s(self, sums: StepSums, ctx: int, tokens: int, on_host: int) -> float:
        """What the mover adds to the step's price of split rows: the system's price, when
        it is the step's first row to keep a device suffix."""
        if self.price_split is None or sums.split_rows or on_host + tokens >= ctx:
            return 0.0
        return self.price_split(self.cost_model, 1)

    def remaining_steps(self, req: Request) -> int:
        """Decode steps the request still runs (at most: it may come back sooner)."""
        return max(1, last_token(req, self.max_model_len) - req.num_computed_tokens)

    def recompute_s(self, ctx: int) -> float:
        """Preempting instead: its context recomputed as prefill chunks of the most a step
        gives one (the token budget, or the long-prefill threshold under it)."""
        total, start, budget = 0.0, 0, max(1, self.step.chunk_cap())
        while start < ctx:
            n = min(budget, ctx - start)
            total += forward_s(self.cost_model, StepShape(prefills=((n, start),), num_sampled=1))
            start += n
        return total


def hidden_under_gpu(balance: HostBalance, sums: StepSums, req: Request, tokens: int,
                     on_host: int = 0) -> bool:
    """The host rows' attention, the mover's `tokens` included, stays under the step's GPU
    work."""
    host = balance.price_rows(balance.cost_model, sums.host_tokens + tokens)
    return host <= balance.factor * sums.gpu_s(balance.cost_model, moved_ctx=tokens)


def cheaper_than_recompute(balance: HostBalance, sums: StepSums, req: Request,
                           tokens: int, on_host: int = 0) -> bool:
    """What the mover's row reads from the host each step it still runs, once `tokens` more
    of its context move (beside the `on_host` it has there already), costs less than
    recomputing its context once: a row moved part by part is priced whole, not by its
    last part, since preempting it is the alternative to all of them."""
    ctx, cm = req.num_computed_tokens + 1, balance.cost_model
    others = sums.host_tokens - on_host
    before = balance.price_rows(cm, others) if others else 0.0
    added = (balance.price_rows(cm, sums.host_tokens + tokens) - before
             + balance.split_s(sums, ctx, tokens, on_host))
    return balance.remaining_steps(req) * added <= balance.factor * balance.recompute_s(ctx)
