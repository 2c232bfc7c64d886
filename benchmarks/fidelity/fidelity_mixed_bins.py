"""Where the cost model misses mixed steps: error by token count of a fidelity trace, or
(--by-time) by when in the run they fell.

  python -m benchmarks.fidelity.fidelity_mixed_bins \
      --real results/fidelity/fidelity_real_h200.json \
      --calibration results/calibration/calib_h200_llama-2-13b.json [--by-time quarters|N]

--by-time quarters: four equal spans of the run's wall time; --by-time N: windows of N
steps (all kinds counted, mixed steps scored). Signed error (predicted - measured) /
measured: > 0 over-priced. "slow" counts mixed steps that took >= 1.25x their price.
--slow: every step of any kind that took >= 1.25x its price (and whether it was the run's
first step at its padded piece size; its host issue time and the garbage collector's time
inside it, where the trace recorded them). --loop-gaps K: the K longest gaps between one step's
execute and the next's (host time in the engine loop; no pricing). --exclude-slow: the
size and time tables without the mixed steps that took >= 1.25x their price.
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from benchmarks.fidelity.fidelity_scoring import step_kind
from benchmarks.fidelity.fidelity_trace import simulate
from kvtier.costmodel.calibration import Calibration
from kvtier.profiler.recording import StepRecord, loop_overheads

EDGES = (0, 300, 400, 500, 700, 1000, 1 << 30)
SLOW = 1.25  # a step that took >= SLOW x its price is "slow"


def mixed_rows(real: dict, calib: Calibration, exclude_slow: bool = False
               ) -> list[tuple[int, float, float, int, float]]:
    """(tokens, predicted s, measured s, step index, seconds since the first step) of every
    mixed step of the real run, priced by the calibration's cost model."""
    engine, _ = simulate(real, calib)
    cm = engine.executor.cost_model
    recs = [StepRecord.from_json(x) for x in real["steps"]]
    t0 = recs[0].start_s
    rows = [(r.shape.num_tokens, cm.predict(r.shape).executor_s, r.execute_s, i, r.start_s - t0)
            for i, r in enumerate(recs) if step_kind(cm, r) == "mixed"]
    return [x for x in rows if x[2] < SLOW * x[1]] if exclude_slow else rows


def _stats(sel: list[tuple]) -> dict:
    p, t = np.array([x[1] for x in sel]), np.array([x[2] for x in sel])
    rel = (p - t) / t
    return {"steps": len(sel), "mape": float(np.mean(abs(rel))),
            "median_ape": float(np.median(abs(rel))), "bias": float(np.mean(rel)),
            "median_error": float(np.median(rel)), "slow": int(np.sum(t >= SLOW * p)),
            "median_measured_ms": float(np.median(t) * 1e3),
            "median_predicted_ms": float(np.median(p) * 1e3)}


def by_time(real: dict, calib: Calibration, window: str, small: int = 300,
            exclude_slow: bool = False) -> list[dict]:
    """Mixed-step error per window of the run (see the module docstring); each row also
    scores the small (< `small` tokens) and large mixed steps apart."""
    rows = mixed_rows(real, calib, exclude_slow)
    num_steps = len(real["steps"])
    if window == "quarters":
        span = (real["steps"][-1][0] - real["steps"][0][0]) / 4
        key, edges = 4, [(k * span, (k + 1) * span) for k in range(4)]
        edges[-1] = (edges[-1][0], float("inf"))
    else:
        n = int(window)
        key, edges = 3, [(lo, lo + n) for lo in range(0, num_steps, n)]
    out = []
    for lo, hi in edges:
        sel = [x for x in rows if lo <= x[key] < hi]
        row = {"window": [lo, hi] if key == 3 else [round(lo, 1), round(min(hi, 1e9), 1)],
               "unit": "steps" if key == 3 else "s"}
        if sel:
            row.update(_stats(sel))
            for name, part in (("small", [x for x in sel if x[0] < small]),
                               ("large", [x for x in sel if x[0] >= small])):
                if part:
                    st = _stats(part)
                    row[name] = {k: st[k] for k in ("steps", "mape", "bias", "median_error",
                                                     "slow")}
        else:
            row["steps"] = 0
        out.append(row)
    return out


def slow_steps(real: dict, calib: Calibration, factor: float = SLOW) -> list[dict]:
    engine, _ = simulate(real, calib)
    cm = engine.executor.cost_model
    recs = [StepRecord.from_json(x) for x in real["steps"]]
    t0, seen, out = recs[0].start_s, set(), []
    counts: dict[str, int] = {}
    for i, r in enumerate(recs):
        kind, pad = step_kind(cm, r), cm.piecewise_size(r.shape)
        counts[kind] = counts.get(kind, 0) + 1
        first = pad is not None and pad not in seen
        seen.add(pad)
        p = cm.predict(r.shape).executor_s
        if r.execute_s >= factor * p:
            out.append({"step": i, "t_s": round(r.start_s - t0, 2), "kind": kind,
                        "tokens": r.shape.num_tokens, "padded": pad, "first_at_pad": first,
                        "measured_ms": round(r.execute_s * 1e3, 2),
                        "predicted_ms": round(p * 1e3, 2),
                        "issue_ms": None if r.issue_s is None else round(r.issue_s * 1e3, 2),
                        "gc_ms": round(gc_overlap(real, r) * 1e3, 2)})
    by_kind = {k: sum(1 for x in out if x["kind"] == k) for k in counts}
    return out + [{"steps_by_kind": counts, "slow_by_kind": by_kind}]


def gc_overlap(real: dict, r: StepRecord) -> float:
    """Seconds of the step's wall time that Python's garbage collector ran (the real run
    records its collections as [start, seconds, generation] in `gc_events`)."""
    end = r.start_s + r.execute_s
    return sum(max(0.0, min(end, s + d) - max(r.start_s, s))
               for s, d, _ in real.get("gc_events", ()))


def loop_gaps(real: dict, k: int) -> list[dict]:
    recs = [StepRecord.from_json(x) for x in real["steps"]]
    gaps = loop_overheads(recs)
    g = np.array([x[1] for x in gaps])
    out = [{"step": int(i), "t_s": round(recs[i].start_s - recs[0].start_s, 2),
            "gap_ms": round(float(g[i]) * 1e3, 2), "kind": gaps[i][0].kind,
            "tokens": gaps[i][0].num_tokens} for i in sorted(np.argsort(-g)[:k])]
    return out + [{"gaps": len(g), "median_ms": float(np.median(g) * 1e3),
                   "p99_ms": float(np.percentile(g, 99) * 1e3)}]


def bins(real: dict, calib: Calibration, exclude_slow: bool = False) -> list[dict]:
    rows = mixed_rows(real, calib, exclude_slow)
    out = []
    for lo, hi in zip(EDGES, EDGES[1:]):
        sel = [x for x in rows if lo <= x[0] < hi]
        if not sel:
            continue
        out.append({"tokens": [lo, hi], **_stats(sel)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--by-time", metavar="quarters|N", default=None,
                    help="error per quarter of the run's wall time, or per N steps")
    ap.add_argument("--slow", action="store_true", help="steps >= 1.25x their price")
    ap.add_argument("--loop-gaps", type=int, default=0, metavar="K")
    ap.add_argument("--exclude-slow", action="store_true")
    args = ap.parse_args()
    real, calib = json.load(open(args.real)), Calibration.load(args.calibration)
    if args.loop_gaps:
        rows = loop_gaps(real, args.loop_gaps)
    elif args.slow:
        rows = slow_steps(real, calib)
    elif args.by_time is not None:
        rows = by_time(real, calib, args.by_time, exclude_slow=args.exclude_slow)
    else:
        rows = bins(real, calib, args.exclude_slow)
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
