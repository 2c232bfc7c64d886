import pytest

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.goodput import goodput_bisect, goodput_grid
from kvtier.bench.metrics import Slo, summarize_run
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.bench.workload import Dataset, WorkloadSpec, at_rate, build_workload
from tests.bench.fake_engine import FakeEngine, VirtualClock


def step_at(threshold):
    return lambda rate: (0.95 if rate <= threshold else 0.5, {"calls": 1})


def test_bisect_finds_threshold_within_tolerance():
    res = goodput_bisect(step_at(7.3), low=1.0, high=64.0, rel_tol=0.02, max_probes=30)
    assert res.rate <= 7.3 and res.rate == pytest.approx(7.3, rel=0.02)
    assert not res.at_upper_bound
    assert [p.rate for p in res.probes[:2]] == [64.0, 1.0]
    assert all((p.attainment >= 0.9) == (p.rate <= 7.3) for p in res.probes)
    assert res.to_dict()["probes"][0]["calls"] == 1


def test_bisect_edges():
    top = goodput_bisect(step_at(100.0), 1.0, 50.0)
    assert top.rate == 50.0 and top.at_upper_bound and len(top.probes) == 1
    none = goodput_bisect(step_at(0.5), 1.0, 50.0)
    assert none.rate is None and len(none.probes) == 2
    capped = goodput_bisect(step_at(7.3), 1.0, 64.0, rel_tol=1e-6, max_probes=5)
    assert len(capped.probes) == 5 and capped.rate <= 7.3
    with pytest.raises(ValueError):
        goodput_bisect(step_at(1.0), 5.0, 5.0)


def test_target_is_inclusive():
    assert goodput_bisect(lambda r: (0.9, None), 1.0, 2.0).rate == 2.0


def test_grid_stops_at_first_failure():
    attain = {1.0: 1.0, 2.0: 0.95, 3.0: 0.85, 4.0: 0.92}  # 4.0 passes by luck past a failure
    res = goodput_grid(lambda r: (attain[r], None), [4.0, 1.0, 3.0, 2.0])
    assert res.rate == 2.0 and not res.at_upper_bound
    assert [p.rate for p in res.probes] == [1.0, 2.0, 3.0, 4.0]
    assert goodput_grid(lambda r: (1.0, None), [1.0, 2.0]).at_upper_bound


def test_goodput_of_fake_engine(word_tokenizer):
    """A real sweep: the workload run on a fake engine at each rate, attainment measured.

    The engine serves one request at a time, each taking ~0.45 s of virtual time (a prefill
    step of 0.01 + 8 * 1e-3, then 39 decode steps of 0.01 + 1e-3); TPOT is always inside
    the SLO, so attainment is decided by the queueing delay in TTFT.
    """
    spec = WorkloadSpec(Dataset.SYNTHETIC, 60, ArrivalSpec(ArrivalKind.POISSON, rate=1.0),
                        seed=1, input_len=8, output_len=40)
    workload = build_workload(spec, word_tokenizer, 1000)
    slo = Slo(ttft_s=0.5, tpot_s=0.05)
    service_s = 0.018 + 39 * 0.011

    def run_at(rate):
        clock = VirtualClock()
        engine = FakeEngine(clock, num_blocks=1000, max_num_seqs=1)
        result = run_workload(EngineBackend(engine, clock=clock), at_rate(workload, rate).requests,
                              RunOptions(progress=False))
        s = summarize_run(result, slo)
        return s.slo_attainment, {"ttft_p90": s.ttft_s.p90}

    res = goodput_bisect(run_at, 0.05, 20.0, rel_tol=0.05)
    assert res.rate is not None and 0.2 < res.rate < 1 / service_s  # queueing starts below saturation
    low, high = run_at(0.1)[0], run_at(10.0)[0]
    assert low >= 0.9 > high
