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
    assert [r["name"] for r in rows[:2]] == ["long_wait", "short_wait"]
    assert rows[0]["calls"] == 1 and rows[0]["total_ms"] >= 25
    assert rows[1]["calls"] == 3 and rows[1]["max_ms"] < rows[0]["max_ms"]
    assert gpu_timeline(list(prof.events())) == {}
