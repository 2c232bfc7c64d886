"""The host rows' cost fit of bench_host_resident (benchmarks/policies/step_fit.py): what a
step records of its plan, and a fit that holds the rest of the step's work equal."""

from __future__ import annotations

import statistics

import pytest

from benchmarks.policies.step_fit import fit_host_step, step_work
from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.policies.directkv import ZeroCopyRowsItem
from kvtier.policies.host_resident import MoveToHost
from kvtier.sampling_params import SamplingParams

KV_BYTES_PER_TOKEN = 131072
CONTEXT = 130_816


def _req(rid: str, start: int, n: int) -> ScheduledRequest:
    return ScheduledRequest(rid, [1] * n, start, ((),), False, True, SamplingParams(), 0)


def test_a_step_records_its_decodes_prefill_host_rows_and_moves():
    plan = StepPlan(scheduled=[_req("h", 99, 1), _req("d", 49, 1), _req("p", 10, 4)],
                    items=[ZeroCopyRowsItem(("h",), 100), MoveToHost("d", (), ((),))])
    work = step_work(plan)
    assert work == {"host_context_tokens": 100, "host_rows": 1, "num_scheduled": 3,
                    "decode_rows": 2, "decode_context_tokens": 150, "prefill_tokens": 4,
                    # causal pairs of 4 queries from position 10: 11 + 12 + 13 + 14
                    "prefill_pairs": 50, "moves": 1}


def _synthetic_run(host_s_per_token: float) -> list[dict]:
    """Steps shaped like the 128K run: one device decode, a prefill chunk of 2,048 tokens
    whose cost grows with its position, and from chunk 20 on a host row beside them; the
    last steps are decodes only."""
    steps = []
    for chunk in range(60):
        start = chunk * 2048
        host = CONTEXT + chunk if chunk >= 20 else 0
        pairs = 2048 * start + 2048 * 2049 // 2
        decode_rows = 2 if host else 1
        step_s = (0.005 + 0.003 + 2e-8 * CONTEXT + 1e-5 * 2048 + 1.7e-9 * pairs
                  + host_s_per_token * host)
        steps.append({"host_context_tokens": host, "host_rows": int(bool(host)),
                      "num_scheduled": decode_rows + 1, "decode_rows": decode_rows,
                      "decode_context_tokens": CONTEXT + host, "prefill_tokens": 2048,
                      "prefill_pairs": pairs, "moves": int(chunk == 20), "step_s": step_s})
    for i in range(20):
        steps.append({"host_context_tokens": 0, "host_rows": 0, "num_scheduled": 2,
                      "decode_rows": 2, "decode_context_tokens": 2 * CONTEXT + i,
                      "prefill_tokens": 0, "prefill_pairs": 0, "moves": 0,
                      "step_s": 0.005 + 2 * (0.003 + 2e-8 * CONTEXT)})
    return steps


def test_the_fit_recovers_the_host_rate_past_a_growing_prefill_chunk():
    truth = KV_BYTES_PER_TOKEN / 50e9
    steps = _synthetic_run(truth)
    fit = fit_host_step(steps, KV_BYTES_PER_TOKEN)
    assert fit is not None
    assert fit["seconds_per_host_token"] == pytest.approx(truth, rel=1e-3)
    assert fit["host_read_gb_per_s"] == pytest.approx(50.0, rel=1e-3)
    assert fit["num_host_steps"] == 40 - 2  # the move's step and two compiling steps left out
    # Set beside the steps without host rows, the host steps' medians charge the host row
    # with the later prefill chunks too: the reading the fit replaces.
    host = [s["step_s"] for s in steps if s["host_context_tokens"]]
    plain = [s["step_s"] for s in steps[:20]]
    naive_s = statistics.median(host) - statistics.median(plain)
    assert naive_s > 1.5 * truth * CONTEXT


def test_no_host_rows_or_old_records_give_no_fit():
    steps = [s for s in _synthetic_run(2e-6) if not s["host_context_tokens"]]
    assert fit_host_step(steps, KV_BYTES_PER_TOKEN) is None
    old = [{"host_context_tokens": 5, "num_scheduled": 1, "step_s": 0.1}] * 10
    assert fit_host_step(old, KV_BYTES_PER_TOKEN) is None
