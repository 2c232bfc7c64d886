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

from typing import Any

import numpy as np

COLUMNS = ("device_decode_rows", "device_decode_context_tokens", "prefill_tokens", "prefill_pairs",
           "host_context_tokens")
COMPILING_HOST_STEPS = 2
# Plan items that move KV (a request to or from the host pool, a recompute); the others a
# step of this bench carries mark its host rows or how they run.
MOVE_SUFFIXES = ("_store", "_load", "recompute_prefix")


def step_work(plan: Any) -> dict[str, int]:
    """What a step plan schedules: its decode rows and their context tokens (host rows'
    included), its host rows and their context tokens, its prefill tokens and the query-key pairs their causal attention scores,
    and how many moves (swaps, host-resident stores and
    loads, recomputes) it also runs."""
    decodes = [r for r in plan.scheduled if len(r.token_ids) == 1]
    prefills = [r for r in plan.scheduled if len(r.token_ids) > 1]
    host_items = [i for i in plan.items if i.kind.endswith("_rows")]
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
    """The least squares above over a run's plain steps, or None when the run had no host
    rows (or too few steps to fit)."""
    rows = plain_steps(steps)
    if not any(s["host_context_tokens"] for s in rows):
        return None
    cols = {name: np.array([_column(s, name) for s in rows], dtype=float) for name in COLUMNS}
    used = [name for name in COLUMNS if np.ptp(cols[name]) > 0]
    x = np.stack([np.ones(len(rows))] + [cols[name] for name in used], 1)
    if len(rows) < 2 * x.shape[1]:
        return None
    y = np.array([s["step_s"] for s in rows])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    slopes = dict(zip(used, coef[1:].tolist()))
    per_token = slopes["host_context_tokens"]
    residual = y - x @ coef
    return {"seconds_per_host_token": per_token,
            "host_read_gb_per_s": kv_bytes_per_token / per_token / 1e9 if per_token > 0 else None,
            "intercept_s": float(coef[0]), "slopes": slopes,
            "num_steps": len(rows), "num_host_steps": int(np.count_nonzero(
                cols["host_context_tokens"])),
            "residual_rms_s": float(np.sqrt(np.mean(residual ** 2)))}


def _column(step: dict[str, Any], name: str) -> int:
    """A step's value of a fit column: the device rows are the decodes less the host rows."""
    if name == "device_decode_rows":
        return step["decode_rows"] - step["host_rows"]
    if name == "device_decode_context_tokens":
        return step["decode_context_tokens"] - step["host_context_tokens"]
    return step[name]
