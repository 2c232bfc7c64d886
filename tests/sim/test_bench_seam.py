"""The simulated engine through the bench harness: the virtual clock as the runner's clock."""

from dataclasses import replace

import pytest

from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import summarize_run
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.engine.args import EngineArgs
from kvtier.sim import VirtualClock, build_sim_engine


def test_bench_runner_on_virtual_time_with_a_shared_clock():
    clock = VirtualClock()
    args = EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=4096)
    reqs = [BenchRequest(tuple(range(5, 5 + 50 + i)), 20 + i, 0.5 * i) for i in range(20)]
    summaries = []
    for policy in ("recompute", "swap"):
        engine = build_sim_engine(replace(args, kv_policy=policy), "h200", clock=clock)
        assert engine.clock is clock
        result = run_workload(EngineBackend(engine, clock=clock), reqs,
                              RunOptions(progress=False), clock=clock)
        summaries.append(summarize_run(result))
    for s in summaries:
        assert s.num_completed == 20
        # Arrivals span 9.5 s of virtual time, served in well under a second each.
        assert 9.5 < s.duration_s < 11 and s.ttft_s.max < 0.5
    # No memory pressure: both policies make the same run (up to rounding of later clocks).
    assert summaries[0].ttft_s.p50 == pytest.approx(summaries[1].ttft_s.p50, rel=1e-9)
    assert clock.now() > 19.0
