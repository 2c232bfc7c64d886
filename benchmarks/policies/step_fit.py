"""What a bench_host_resident step did, and the host rows' cost fit from a run's steps.

A step with host rows often runs other work too: the decodes on the device, and, at long
contexts, a prefill chunk of a request that has just been admitted, whose cost grows with
the chunk's position in its prompt. Putting the host-row steps' times beside those of other
steps (their median against another median, or a line through the host steps alone) then
charges the host rows with whatever the steps differ in besides them. So each step records
the work it scheduled, and the fit is one least-squares over all the run's plain steps:

    step_s = a + b_rows x device decode rows + b_ctx x their context tokens
               + b_pt x prefill tokens + b_pp x prefill query-key pairs
               + b_host x host context tokens

"Plain": no move or swap in the step, and not the run's first two host-row steps (their
kernels compile). b_host is the step time a host context token adds with the rest of the
step held equal; kv bytes per token / b_host is the rate its K and V were read at. A
column that never varies over the steps is left out of the fit (its cost is in `a`).
"""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

COLUMNS = ("device_decode_rows", "device_decode_context_tokens", "prefill_tokens", "prefill_pairs",
           "host_context_tokens")
COMPILING_HOST_STEPS = 2
# Plan items that move KV (a request to or from the host pool, a recompute); the others a
# step of this bench carries mark its host rows or how they run.
MOVE_SUFFIXES = ("_store", "_load", "recompute_prefix")
OUTLIER_FACTOR = 4.0
CONTEXT_SLACK = 0.01  # device decode context of a paired step: within 1 % of the host step's


def step_work(plan: Any) -> dict[str, int]:
    """What a step plan schedules: its decode rows and their context tokens (host rows'
    included), its host rows and their context tokens, its prefill tokens and the query-key pairs their causal attention scores,
    and how many moves (swaps, host-resident stores and
    loads, recomputes) it also runs."""
    decodes = [r for r in plan.scheduled if len(r.token_ids) == 1]
    prefills = [r for r in plan.scheduled if len(r.token_ids) > 1]
    # The rows items name their requests (a count of split rows beside them does not).
    host_items = [i for i in plan.items if i.kind.endswith("_rows") and hasattr(i, "request_ids")]
    return {
        "host_context_tokens": sum(i.count for i in host_items),
        "host_rows": sum(len(getattr(i, "request_ids", ())) for i in host_items),
        "num_scheduled": len(plan.scheduled),
        "decode_rows": len(decodes),
        "decode_context_tokens": sum(r.start_pos + 1 for r in decodes),
        "prefill_tokens": sum(len(r.token_ids) for r in prefills),
        "prefill_pairs": sum(len(r.token_ids) * r.start_pos
                             + len(r.token_ids) * (len(r.token_ids) + 1) // 2 for r in prefills),
        "moves": len(plan.swap_in) + len(plan.swap_out)
                 + sum(i.kind.endswith(MOVE_SUFFIXES) for i in plan.items),
    }


def plain_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps the fit reads: recorded with their work, without moves, and past the first
    host-row steps."""
    out, host_seen = [], 0
    for s in steps:
        if "decode_rows" not in s:
            return []  # recorded before steps carried their work
        if s["host_context_tokens"]:
            host_seen += 1
            if host_seen <= COMPILING_HOST_STEPS:
                continue
        if not s["moves"]:
            out.append(s)
    return out


def fit_host_step(steps: list[dict[str, Any]], kv_bytes_per_token: int) -> dict[str, Any] | None:
    """The least squares above over a run's plain steps, fit again without the steps it
    misses by more than OUTLIER_FACTOR times its median miss (a step that compiled a kernel
    for a shape first met there); None when the run had no host rows (or too few steps)."""
    rows = plain_steps(steps)
    if not any(s["host_context_tokens"] for s in rows):
        return None
    first = _least_squares(rows)
    if first is None:
        return None
    miss = np.abs(first[2])
    kept = [s for s, m in zip(rows, miss) if m <= OUTLIER_FACTOR * max(np.median(miss), 1e-6)]
    fit = _least_squares(kept)
    if fit is None:  # the outliers were all the host rows' variation
        kept, fit = rows, first
    intercept, slopes, residual = fit
    per_token = slopes["host_context_tokens"]
    return {"seconds_per_host_token": per_token,
            "host_read_gb_per_s": kv_bytes_per_token / per_token / 1e9 if per_token > 0 else None,
            "intercept_s": intercept, "slopes": slopes,
            "num_steps": len(kept), "num_left_out": len(rows) - len(kept),
            "num_host_steps": sum(bool(s["host_context_tokens"]) for s in kept),
            "residual_rms_s": float(np.sqrt(np.mean(residual ** 2)))}


def _least_squares(rows: list[dict[str, Any]]
                   ) -> tuple[float, dict[str, float], np.ndarray] | None:
    """(the intercept, each varying column's slope, the residuals), or None when the host
    tokens do not vary or there are fewer than two steps per coefficient."""
    cols = {name: np.array([_column(s, name) for s in rows], dtype=float) for name in COLUMNS}
    used = [name for name in COLUMNS if np.ptp(cols[name]) > 0]
    if "host_context_tokens" not in used:
        return None
    x = np.stack([np.ones(len(rows))] + [cols[name] for name in used], 1)
    if len(rows) < 2 * x.shape[1]:
        return None
    y = np.array([s["step_s"] for s in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    return float(coef[0]), dict(zip(used, coef[1:].tolist())), y - x @ coef


def paired_host_cost(steps: list[dict[str, Any]], baseline: list[dict[str, Any]],
                     kv_bytes_per_token: int) -> dict[str, Any] | None:
    """The host rows' cost read without a model: each plain host-row step against the
    baseline run's plain steps (a policy that kept every row on the device) that ran the
    same prefill chunk and as many device decodes of about the same context; the median of
    the differences, and the rate that makes of the host rows' bytes."""
    by_work: dict[tuple[int, int, int], list[dict[str, Any]]] = {}
    for s in plain_steps(baseline):
        by_work.setdefault(_work_key(s), []).append(s)
    diffs, tokens = [], []
    for s in plain_steps(steps):
        if not s["host_context_tokens"]:
            continue
        context = _column(s, "device_decode_context_tokens")
        peers = [p for p in by_work.get(_work_key(s), [])
                 if abs(_column(p, "device_decode_context_tokens") - context)
                 <= CONTEXT_SLACK * max(1, context)]
        if peers:
            diffs.append(s["step_s"] - statistics.median(p["step_s"] for p in peers))
            tokens.append(s["host_context_tokens"])
    if not diffs:
        return None
    extra, host = statistics.median(diffs), statistics.median(tokens)
    return {"num_pairs": len(diffs), "median_extra_s": extra, "median_host_tokens": host,
            "host_read_gb_per_s": host * kv_bytes_per_token / extra / 1e9 if extra > 0 else None,
            "extra_s_quartiles": statistics.quantiles(diffs, n=4) if len(diffs) > 1 else diffs}


def _work_key(step: dict[str, Any]) -> tuple[int, int, int]:
    return step["prefill_tokens"], step["prefill_pairs"], _column(step, "device_decode_rows")


def _column(step: dict[str, Any], name: str) -> int:
    """A step's value of a fit column: the device rows are the decodes less the host rows."""
    if name == "device_decode_rows":
        return step["decode_rows"] - step["host_rows"]
    if name == "device_decode_context_tokens":
        return step["decode_context_tokens"] - step["host_context_tokens"]
    return step[name]
def analyse(result: dict[str, Any]) -> list[dict[str, Any]]:
    """For each run of a bench_host_resident result with host rows: the fit, and the paired
    reading against every run of the same cap without host rows."""
    kv_bytes = result["model_rates"]["kv_bytes_per_token"]
    runs = [r for r in result["policies"] if "steps" in r]
    out = []
    for run in runs:
        fit = fit_host_step(run["steps"], kv_bytes)
        if fit is None:
            continue
        paired = {b["policy"]: paired_host_cost(run["steps"], b["steps"], kv_bytes)
                  for b in runs if b["cap"] == run["cap"]
                  and not any(s["host_context_tokens"] for s in b["steps"])}
        out.append({"policy": run["policy"], "cap": run["cap"], "fit": fit, "paired": paired})
    return out


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json

    from benchmarks.common import write_result

    p = argparse.ArgumentParser(description="The host rows' cost in a bench_host_resident "
                                            "result, with the rest of each step held equal")
    p.add_argument("result", help="a bench_host_resident result JSON (steps with their work)")
    p.add_argument("--out", default=None, help="result JSON")
    args = p.parse_args(argv)
    with open(args.result) as f:
        rows = analyse(json.load(f))
    for row in rows:
        print(f"{row['policy']} cap {row['cap']}: fit {row['fit']['host_read_gb_per_s']} GB/s; "
              + "; ".join(f"against {b}: {v and v['host_read_gb_per_s']} GB/s"
                          for b, v in row["paired"].items()))
    if args.out:
        write_result(args.out, {"source": args.result, "runs": rows})


if __name__ == "__main__":
    main()
