"""eLLM's request-level planner: batch size b and uncached ratio r that maximise b / T(b, r).

    max_{b, r}  b / T(b, r)
    s.t.        T(b, r) + max_wait <= TPOT SLO
                b * s * (1 - r) * kv_bytes  +  M_o(b, r)  <=  KV memory budget
                1 <= b <= B,   0 <= r <= r_max

solved with SciPy's SLSQP, against a baseline found without it: the largest batch that keeps
every token cached (r = 0), which an answer with r > 0 must beat by `min_gain` — so the planner
never drops KV when its own model says recomputation does not pay, nor because SLSQP failed to
find a feasible point (the baseline answers then). Unlike the paper's FLOPs-only T, ours is a
roofline: each part of a step costs the larger of its FLOPs over the bf16 peak and its bytes
over HBM bandwidth, so the planner knows the ridge point — while b plus the recomputed tokens
stay under it the linear layers are bandwidth-bound and the recomputation rides along almost
free; past it every recomputed token costs full price. `max` is smoothed (an 8-norm) so SLSQP
sees a differentiable problem. M_o is the recompute scratch: one layer group's KV of the
recomputed tokens (kvtier keeps only that much alive, `kvtier/runner/host_batch.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize

from kvtier.config import ModelConfig
from kvtier.policies.ellm.options import copied_groups_in_flight

_P = 8.0  # smooth max: (x^p + y^p)^(1/p) is within 9 % of max(x, y), and differentiable


def _smax(x: float, y: float) -> float:
    return float((x**_P + y**_P) ** (1.0 / _P))


@dataclass(frozen=True)
class PlannerConfig:
    hbm_bytes_per_s: float  # e.g. 4.24e12 on the H200 (copy bandwidth)
    bf16_flops: float  # e.g. 761e12
    kv_budget_bytes: float  # device memory for cached KV and the recompute scratch
    tpot_slo_s: float
    max_batch: int = 256
    max_uncached_ratio: float = 0.9
    layers_per_block: int = 4
    step_overhead_s: float = 0.5e-3  # launches and host work not hidden behind the GPU
    dtype_bytes: int = 2
    # What the ceilings deliver in practice (1.0: the roofline as measured by the probes) and
    # the extra cost of a step that recomputes anything (it leaves the full-model decode graph
    # for piecewise graphs with eager attention and a prefill attention). Fitted to the
    # calibrated cost model by `kvtier.policies.ellm.planner.fit.fit_to_cost_model`.
    flops_efficiency: float = 1.0
    hbm_efficiency: float = 1.0
    recompute_overhead_s: float = 0.0
    # r > 0 must beat the best batch at r = 0 by this fraction of throughput: a dropped
    # prefix is paid on every later step, and the fitted model is not exact on decode steps
    # (results/planner/planner_fit.json).
    min_gain: float = 0.02
    # eLLM's layer-level overlap (--ellm-host-groups): a dropped prefix recomputes only the
    # lower groups and copies the top `host_groups` in over PCIe, beside the forward; its
    # scratch (M_o) holds those groups' copies too.
    host_groups: int = 0
    copy_window: int = 2  # copied groups in flight at once (0: all): scratch sets in M_o
    pcie_bytes_per_s: float = 55e9


@dataclass(frozen=True)
class Decision:
    batch: int
    uncached_ratio: float
    step_time_s: float
    feasible: bool
    solve_time_s: float


class RequestLevelPlanner:
    def __init__(self, model: ModelConfig, cfg: PlannerConfig):
        self.m, self.cfg = model, cfg
        d = cfg.dtype_bytes
        embed = model.vocab_size * model.hidden_size
        self.linear_params = model.num_params() - embed * (1 if model.tie_word_embeddings else 2)
        self.lm_head_params = embed
        self.kv_bytes_per_token = model.kv_bytes_per_token(d)
        layers_in_group = min(cfg.layers_per_block, model.num_layers)
        groups = -(-model.num_layers // layers_in_group)
        # M_o per recomputed token: one group's KV for the recompute, plus a set for each
        # copied group in flight.
        in_flight = copied_groups_in_flight(cfg.host_groups, cfg.copy_window)
        self.scratch_bytes_per_token = (self.kv_bytes_per_token * layers_in_group
                                        * (1 + in_flight) / model.num_layers)
        self.recomputed_fraction = (groups - cfg.host_groups) / groups  # of the layers

    # ---- the model of one step -------------------------------------------------------
    def step_time(self, b: float, r: float, s: float) -> float:
        """Seconds of a decode step of b requests of context s with a fraction r of each
        context dropped and recomputed (b * s * r extra tokens through the model's lower
        layers: all of them unless the top groups' prefix KV is copied in, see host_groups)."""
        c, m, d = self.cfg, self.m, self.cfg.dtype_bytes
        bw, flops = c.hbm_bytes_per_s * c.hbm_efficiency, c.bf16_flops * c.flops_efficiency
        recomputed = b * s * r
        f = self.recomputed_fraction
        weights = self.linear_params * d / bw
        linear = f * _smax(weights, 2.0 * self.linear_params * (b + recomputed) / flops)
        if f < 1.0:  # the layers above the split see the decodes alone
            linear += (1.0 - f) * _smax(weights, 2.0 * self.linear_params * b / flops)
        head = _smax(self.lm_head_params * d / bw, 2.0 * self.lm_head_params * b / flops)
        # Attention: decode rows read the cached KV; the recomputed prefix is a causal prefill
        # (its KV is written and read back from scratch, L2-resident in practice).
        kv_read = b * s * (1.0 - r) * self.kv_bytes_per_token
        attn_flops = 4.0 * m.num_layers * m.q_size * (b * s + f * b * (s * r) ** 2 / 2.0)
        attn = _smax(kv_read / bw, attn_flops / flops)
        # The switch cost of recomputing at all, smoothed (a step so SLSQP keeps a gradient):
        # full by r = 1 %, about a block of a 2k context.
        switch = c.recompute_overhead_s * r / (r + 0.002)
        forward = linear + head + attn + c.step_overhead_s + switch
        if f == 1.0:
            return forward
        copy = recomputed * self.kv_bytes_per_token * (1.0 - f) / c.pcie_bytes_per_s
        return _smax(forward, copy)  # the copies run beside the forward

    def memory(self, b: float, r: float, s: float) -> float:
        cached = b * s * (1.0 - r) * self.kv_bytes_per_token
        scratch = b * s * r * self.scratch_bytes_per_token  # M_o
        return cached + scratch

    # ---- the solve -------------------------------------------------------------------
    def solve(self, contexts: list[int], max_wait_s: float = 0.0) -> Decision:
        """`contexts`: the lengths of the requests that could run (running, then waiting)."""
        t0 = time.perf_counter()
        c = self.cfg
        n = max(1, min(c.max_batch, len(contexts)))
        s = float(np.mean(contexts)) if contexts else 1.0
        budget = c.tpot_slo_s - max_wait_s
        def slo_slack(x: np.ndarray) -> float:
            return (budget - self.step_time(x[0], x[1], s)) / budget

        def memory_slack(x: np.ndarray) -> float:
            return (c.kv_budget_bytes - self.memory(x[0], x[1], s)) / c.kv_budget_bytes

        cons = [{"type": "ineq", "fun": slo_slack}, {"type": "ineq", "fun": memory_slack}]
        bounds = [(1.0, float(n)), (0.0, c.max_uncached_ratio)]
        # The baseline SLSQP must beat: the largest batch that keeps everything cached.
        b0 = self._cached_batch(n, s, budget)
        base = (-b0 / self.step_time(b0, 0.0, s), np.array([float(b0), 0.0])) if b0 else None
        best = None
        for x0 in ((float(n), 0.0), (1.0, 0.0), (float(n), c.max_uncached_ratio)):
            res = minimize(lambda x: -x[0] / self.step_time(x[0], x[1], s), np.array(x0),
                           method="SLSQP", bounds=bounds, constraints=cons,
                           options={"maxiter": 100, "ftol": 1e-9})
            # SLSQP often stops at the optimum with "positive directional derivative in
            # linesearch" (success False), sometimes a hair outside a bound; the answer is
            # the whole batch below its point, which any point that close satisfies.
            x = np.array([max(1.0, np.floor(res.x[0] + 1e-6)), res.x[1]])
            ok = min(slo_slack(x), memory_slack(x)) >= -1e-9
            value = -x[0] / self.step_time(x[0], x[1], s)
            if ok and (best is None or value < best[0]):
                best = (value, x)
        if base is not None and (best is None or -best[0] < (1.0 + c.min_gain) * -base[0]):
            best = base  # recomputation does not pay (or SLSQP found no feasible point)
        if best is None:
            # Not even one request fits cached within both bounds: dropping helps only if
            # memory is what it misses (more recomputation cannot shorten the step).
            r = c.max_uncached_ratio if self.memory(1, 0.0, s) > c.kv_budget_bytes else 0.0
            b, feasible = 1, False
        else:
            b, r, feasible = int(best[1][0]), float(best[1][1]), True
        return Decision(b, r, self.step_time(b, r, s), feasible, time.perf_counter() - t0)

    def _cached_batch(self, n: int, s: float, time_budget: float) -> int:
        """The largest batch (<= n) that fits memory and the SLO at r = 0; 0 if none."""
        c = self.cfg
        hi = min(n, int(c.kv_budget_bytes // max(1.0, self.memory(1, 0.0, s))))
        if hi < 1 or self.step_time(1, 0.0, s) > time_budget:
            return 0
        lo = 1  # step_time grows with b: bisect for the SLO
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.step_time(mid, 0.0, s) <= time_budget else (lo, mid - 1)
        return lo
