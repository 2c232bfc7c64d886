import pytest

from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import engine_summary, summarize_run
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, run_workload
from tests.bench.fake_engine import FakeEngine, VirtualClock

QUIET = RunOptions(progress=False)


def run(engine, clock, requests, options=QUIET):
    return run_workload(EngineBackend(engine, clock=clock), requests, options)


def test_timestamps_exact_on_virtual_clock():
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.01, per_token_s=0.001)
    result = run(engine, clock, [BenchRequest(tuple(range(10)), 3, arrival_s=0.5)])
    (r,) = result.records
    # Idle until 0.5; prefill step 0.01 + 10 * 0.001, then two decode steps of 0.011.
    assert r.arrival_s == pytest.approx(0.5)
    assert r.token_times_s == pytest.approx((0.52, 0.531, 0.542))
    assert r.ttft_s == pytest.approx(0.02) and r.tpot_s == pytest.approx(0.011)
    assert r.finish_reason == "length" and r.ok
    assert result.duration_s == pytest.approx(0.542)
    assert len(result.steps) == 3 and result.steps[0].stats.num_scheduled_tokens == 10


def test_late_submission_counts_as_queueing():
    clock = VirtualClock()
    engine = FakeEngine(clock, num_blocks=1024, base_s=0.01, per_token_s=0.001, max_model_len=4096)
    reqs = [BenchRequest(tuple(range(1000)), 2, 0.0), BenchRequest((1, 2), 2, 0.1)]
    result = run(engine, clock, reqs)
    long, short = result.records
    assert long.token_times_s[0] == pytest.approx(1.01)
    assert result.max_submit_lag_s == pytest.approx(0.91)
    assert short.arrival_s == pytest.approx(0.1)  # its due time, not when it was handed over
    assert short.ttft_s > 0.91


def test_preemptions_recorded_and_all_requests_complete():
    clock = VirtualClock()
    engine = FakeEngine(clock, num_blocks=12, block_size=4, max_num_seqs=8)
    reqs = [BenchRequest(tuple(range(8)), 12, 0.001 * i) for i in range(6)]
    result = run(engine, clock, reqs)
    assert all(r.ok and r.output_len == 12 for r in result.records)
    eng = engine_summary(result)
    assert eng["num_preemptions"] > 0 and eng["num_recomputed_tokens"] > 0
    assert sum(r.num_preemptions for r in result.records) == eng["num_preemptions"]
    assert eng["max_gpu_blocks_used"] <= 12 and eng["num_generation_tokens"] == 6 * 12
    assert summarize_run(result).num_completed == 6


def test_counters_exclude_what_ran_before():
    clock = VirtualClock()
    engine = FakeEngine(clock, num_blocks=12)
    reqs = [BenchRequest(tuple(range(8)), 12, 0.0) for _ in range(6)]
    run(engine, clock, reqs)  # a warm-up that preempts
    before = engine.preemptions
    assert before > 0
    result = run(engine, clock, [BenchRequest((1, 2, 3), 2)])
    assert engine_summary(result)["num_preemptions"] == 0


def test_rejected_request_recorded_as_failed():
    clock = VirtualClock()
    engine = FakeEngine(clock, max_model_len=16)
    result = run(engine, clock, [BenchRequest(tuple(range(20)), 4), BenchRequest((1,), 2, 0.2)])
    bad, good = result.records
    assert not bad.ok and "rejected" in bad.error
    assert good.ok and good.output_len == 2


def test_time_limit_aborts_the_rest():
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.1, max_num_seqs=1)
    reqs = [BenchRequest((1, 2), 5, 0.1 * i) for i in range(10)]
    result = run(engine, clock, reqs, RunOptions(progress=False, max_duration_s=1.0))
    reasons = [r.finish_reason for r in result.records]
    assert reasons[0] == "length" and "abort" in reasons
    assert not any(r.error for r in result.records)  # all were due before the limit
    assert sum(r.ok for r in result.records) < 10
    assert not engine.has_unfinished_requests()


def test_time_limit_before_later_arrivals():
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.1, max_num_seqs=1)
    reqs = [BenchRequest((1, 2), 50, 0.0), BenchRequest((1, 2), 5, 100.0)]
    result = run(engine, clock, reqs, RunOptions(progress=False, max_duration_s=1.0))
    first, unsent = result.records
    assert first.finish_reason == "abort" and 0 < first.output_len < 50
    assert unsent.error == "not sent before the run's time limit" and unsent.arrival_s == 100.0


def test_backend_uses_the_engines_own_virtual_clock():
    import time

    from kvtier.bench.clock import MonotonicClock

    clock = VirtualClock()
    engine = FakeEngine(clock)  # has .clock with now()/sleep(), like the simulator's engines
    backend = EngineBackend(engine)
    assert backend.clock is clock
    result = run_workload(backend, [BenchRequest((1, 2), 2, arrival_s=5.0)], QUIET)
    assert result.records[0].arrival_s == pytest.approx(5.0)  # slept 5 s of virtual time

    engine.clock = time.monotonic  # LLMEngine's default: a plain function
    assert isinstance(EngineBackend(engine).clock, MonotonicClock)


def test_request_dropped_by_engine_fails_instead_of_hanging():
    clock = VirtualClock()
    engine = FakeEngine(clock)
    backend = EngineBackend(engine)
    backend.submit("a", BenchRequest((1, 2), 3), clock.now())
    engine.abort_request("a")  # behind the backend's back
    (record,) = backend.poll(0.1)
    assert record.error == "the engine dropped the request unfinished" and not record.ok
    assert backend.num_unfinished() == 0


def test_time_limit_leaves_later_arrivals_out_of_attainment():
    from kvtier.bench.metrics import Slo, summarize_run

    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.01, max_num_seqs=4)
    reqs = [BenchRequest((1, 2), 3, 0.0), BenchRequest((1, 2), 3, 0.1),
            BenchRequest((1, 2), 3, 100.0)]
    result = run(engine, clock, reqs, RunOptions(progress=False, max_duration_s=1.0))
    s = summarize_run(result, Slo(ttft_s=0.5))
    assert (s.num_sent, s.num_completed, s.num_not_sent) == (2, 2, 1)
    assert s.slo_attainment == 1.0 and s.slo_attainment_all == pytest.approx(2 / 3)


def test_max_concurrency_holds_requests_on_the_client():
    """vLLM's and SGLang's --max-concurrency: never more than the cap in flight; a held
    request is sent when one ends, and timed from then."""
    clock = VirtualClock()
    engine = FakeEngine(clock, base_s=0.01, per_token_s=0.001)
    reqs = [BenchRequest(tuple(range(10)), 4, arrival_s=0.0) for _ in range(5)]
    result = run(engine, clock, reqs, RunOptions(progress=False, max_concurrency=2))
    records = result.records
    assert all(r.ok for r in records)
    for r in records:  # at any send, at most the cap in flight, this one counted
        in_flight = sum(o.arrival_s <= r.arrival_s < o.finish_s for o in records)
        assert in_flight <= 2
    ends = sorted(r.finish_s for r in records)
    assert [r.arrival_s for r in records[:2]] == [0.0, 0.0]
    for r in records[2:]:  # held ones go out as soon as one ends, not at their due time
        assert r.arrival_s > 0 and min(abs(r.arrival_s - e) for e in ends) < 1e-9
        assert r.ttft_s < records[0].ttft_s + 0.05  # no client-side wait in its TTFT
    clock = VirtualClock()
    uncapped = run(FakeEngine(clock, base_s=0.01, per_token_s=0.001), clock, reqs)
    assert [r.arrival_s for r in uncapped.records] == [0.0] * 5  # all sent when due


def test_max_concurrency_must_be_positive():
    with pytest.raises(ValueError, match="max-concurrency"):
        RunOptions(max_concurrency=0)
