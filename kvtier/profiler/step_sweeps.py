"""Whole runner steps (`ModelRunner.execute` on synthetic plans) and swap copies: the ground
truth the host parameters are fitted to."""

from __future__ import annotations

import random
import time

import torch

from kvtier.core.plan import BlockCopy, StepPlan
from kvtier.costmodel.shape import StepShape
from kvtier.model.llama import ForwardContext
from kvtier.profiler.plans import PlanBuilder, finish_plan
from kvtier.profiler.sweeps import Log
from kvtier.profiler.timing import DeviceTimer

Case = tuple[list[int], list[tuple[int, int]]]  # (decode contexts, prefill chunks)


def step_cases(max_seqs: int, max_tokens: int, max_len: int, pool_tokens: int,
               seed: int = 0) -> list[Case]:
    """Decode-only batches of every size class (graph replays) and mixed/prefill steps of
    the shapes a ShareGPT-like stream makes (a few prompts joining running decodes), with
    heterogeneous contexts."""
    rng = random.Random(seed)
    cases: list[Case] = []

    def contexts(n: int, mean: int) -> list[int]:
        mean = max(16, min(mean, int(0.7 * pool_tokens / max(n, 1))))
        return [rng.randint(max(2, mean // 4), min(max_len - 1, 2 * mean - mean // 4))
                for _ in range(n)]

    for b in (1, 2, 5, 8, 13, 16, 24, 32, 40, 56, 64, 80, 100, 128, 150, 180, 210, 256):
        if b <= max_seqs:
            cases.append((contexts(b, rng.choice((250, 500, 900))), []))
    for b in (0, 3, 12, 40, 90, 150, 220):
        for pre in ([24], [150], [600], [300, 80], [1000], [700, 400, 120], [2000]):
            if b + len(pre) <= max_seqs and b + sum(pre) <= max_tokens:
                chunks = [(min(n, max_len - 1), 0) for n in pre]
                cases.append((contexts(b, rng.choice((250, 500, 900))), chunks))
    long = min(max_tokens, max_len - 1)
    cases.append(([], [(long, 0)]))  # one full-budget prefill
    cases.append((contexts(16, 400), [(min(1024, max_len // 2), max_len // 4)]))  # a late chunk
    return [(c, p) for c, p in cases
            if len(c) + len(p) <= max_seqs and len(c) + sum(n for n, _ in p) <= max_tokens]


class StepSweeper:
    def __init__(self, runner, timer: DeviceTimer, builder: PlanBuilder, log: Log = print):
        self.runner, self.timer, self.builder, self.log = runner, timer, builder, log

    def step(self, contexts: list[int], prefills: list[tuple[int, int]]) -> dict | None:
        b, runner = self.builder, self.runner
        b.reset()
        if not b.fits(list(contexts) + [n + s for n, s in prefills]):
            return None
        install, steady = b.decode_rows(contexts)
        pre = b.prefill_rows(prefills)
        if install:
            runner.execute(StepPlan(scheduled=install))
        plan = StepPlan(scheduled=steady + pre)
        try:
            wall = self.timer.wall_seconds(lambda: runner.execute(plan), warmup=2)
            shape = StepShape.from_plan(plan)
            issue = self.issue_seconds(plan) if prefills else None
            pieces = self.piecewise_issue_seconds(plan) if prefills else None
        finally:
            runner.execute(finish_plan(steady + pre))
        row = {"shape": shape.to_json(), "wall_s": wall, "issue_s": issue}
        if pieces is not None:  # the step's wall above went through the pieces
            row["issue_piecewise_s"] = pieces
        return row

    def issue_seconds(self, plan: StepPlan) -> float:
        """Host time to issue an eager forward (the call returns before the GPU is done);
        measured with piecewise graphs on as well: the eager launch cost stays calibrated."""
        r = self.runner
        batch = r.prepare_batch(plan.scheduled)
        ids, pos, meta = r.device_inputs(batch)
        ctx = ForwardContext(r.ops, r.attention, r.gpu_kv, meta, r.cos_sin)
        return self._median_issue(lambda: r.model(ids, pos, ctx))

    def piecewise_issue_seconds(self, plan: StepPlan) -> float | None:
        """Host time to issue the same forward through the runner's piecewise graphs (None
        when it has none captured, or the step is larger than its largest size)."""
        r = self.runner
        pw = getattr(r, "piecewise", None)
        if pw is None or not pw.graphs:
            return None
        batch = r.prepare_batch(plan.scheduled)
        if pw.padded(batch.num_tokens) is None:
            return None
        ids, pos, meta = r.device_inputs(batch)
        return self._median_issue(lambda: pw.forward(ids, pos, meta))

    def _median_issue(self, fn) -> float:
        times = []
        with torch.inference_mode():
            for _ in range(self.timer.reps):
                self.timer.sync()
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
                self.timer.sync()
        times.sort()
        return times[len(times) // 2]

    def steps(self, cases: list[Case]) -> list[dict]:
        out = []
        for contexts, prefills in cases:
            row = self.step(contexts, prefills)
            if row is None:
                continue
            out.append(row)
            sh = StepShape.from_json(row["shape"])
            issue = f" issue {row['issue_s'] * 1e3:.2f} ms" if row["issue_s"] else ""
            if row.get("issue_piecewise_s"):
                issue += f" (pieces {row['issue_piecewise_s'] * 1e3:.2f} ms)"
            self.log(f"  step {sh.kind:>7} reqs {sh.num_reqs:>3} tokens {sh.num_tokens:>5}: "
                     f"{row['wall_s'] * 1e3:.2f} ms{issue}")
        return out

    def copies(self, counts: list[int]) -> dict[str, list[list[float]]]:
        limit = min(self.runner.host_kv.shape[0], self.builder.num_blocks)
        res: dict[str, list[list[float]]] = {"out": [], "in": []}
        for n in counts:
            if n <= limit:
                res["out"].append([n, self._copy(n, out=True)])
                res["in"].append([n, self._copy(n, out=False)])
        self.log("  swap out: " + ", ".join(f"{n}:{t * 1e3:.2f}ms" for n, t in res["out"]))
        self.log("  swap in: " + ", ".join(f"{n}:{t * 1e3:.2f}ms" for n, t in res["in"]))
        return res

    def _copy(self, n: int, out: bool) -> float:
        blocks = [BlockCopy(i, i) for i in range(n)]
        args = (blocks, []) if out else ([], blocks)
        return self.timer.wall_seconds(lambda: self.runner.copy_blocks(*args))
