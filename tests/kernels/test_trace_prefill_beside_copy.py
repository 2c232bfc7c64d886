"""The trace's summaries read a torch.profiler event list: the host thread's events by total
time (a sync the copies hold up would top the prefill thread's list; the copy thread's CUDA
calls come from CUPTI, only on a GPU), and the GPU's gaps (none without a GPU)."""

from __future__ import annotations

import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.kernels.trace_prefill_beside_copy import gpu_timeline, host_calls


def test_host_calls_rank_the_threads_events_by_total_time():
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            with torch.profiler.record_function("short_wait"):
                time.sleep(0.002)
        with torch.profiler.record_function("long_wait"):
            time.sleep(0.03)
        torch.ones(4).add_(1)
    (rows,) = host_calls(list(prof.events())).values()
    # By name, not position: the profiler's own first-use events may rank anywhere.
    by_name = {r["name"]: (i, r) for i, r in enumerate(rows)}
    (i_long, long), (i_short, short) = by_name["long_wait"], by_name["short_wait"]
    assert i_long < i_short
    assert long["calls"] == 1 and long["total_ms"] >= 25
    assert short["calls"] == 3 and short["max_ms"] < long["max_ms"]
    assert gpu_timeline(list(prof.events())) == {}


def test_copy_counts_count_the_copies_and_memsets_by_kind():
    from benchmarks.kernels.trace_prefill_beside_copy import copy_counts

    spans = [(0, 1, "Memcpy HtoD (Pageable -> Device)"), (1, 2, "_rms_norm_kernel"),
             (2, 3, "Memcpy HtoD (Pageable -> Device)"), (3, 4, "Memset (Device)")]
    assert copy_counts(spans) == {"Memcpy HtoD (Pageable -> Device)": 2, "Memset (Device)": 1}
