import numpy as np
import pytest

from kvtier.bench.arrivals import (
    PAPER_AZURE_CV,
    ArrivalKind,
    ArrivalSpec,
    arrival_gaps,
    arrival_offsets,
    paper_azure_gamma,
)


@pytest.mark.parametrize("mean_s,cv", [(0.02215, 37.49 / 22.15), (0.5, 1.0), (0.1, 0.5), (0.011, 3.0)])
def test_gamma_mean_and_cv_within_5_percent(mean_s, cv):
    gaps = arrival_gaps(ArrivalSpec(ArrivalKind.GAMMA, rate=1 / mean_s, cv=cv), 10_000, seed=3)
    assert gaps.mean() == pytest.approx(mean_s, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.05)
    assert (gaps >= 0).all()


def test_poisson_gaps_exponential():
    gaps = arrival_gaps(ArrivalSpec(ArrivalKind.POISSON, rate=4.0), 10_000, seed=0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_offsets_start_at_zero_and_accumulate():
    spec = ArrivalSpec(ArrivalKind.TRACE, trace_gaps_s=(1.0, 2.0, 3.0, 4.0), scale=2.0)
    np.testing.assert_allclose(arrival_offsets(spec, 4, seed=0), [0.0, 0.5, 1.5, 3.0])
    assert spec.mean_rate == pytest.approx(2.0 / 2.5)
    np.testing.assert_array_equal(arrival_offsets(ArrivalSpec(ArrivalKind.OFFLINE), 3, 0), [0, 0, 0])
    with pytest.raises(ValueError, match="4 gaps"):
        arrival_offsets(spec, 6, seed=0)


def test_seeded():
    spec = ArrivalSpec(ArrivalKind.GAMMA, rate=10.0, cv=2.0)
    np.testing.assert_array_equal(arrival_offsets(spec, 50, 1), arrival_offsets(spec, 50, 1))
    assert not np.array_equal(arrival_offsets(spec, 50, 1), arrival_offsets(spec, 50, 2))


def test_with_rate():
    g = ArrivalSpec(ArrivalKind.GAMMA, rate=10.0, cv=2.0).with_rate(3.0)
    assert (g.rate, g.cv) == (3.0, 2.0)
    t = ArrivalSpec(ArrivalKind.TRACE, trace_gaps_s=(0.1, 0.3)).with_rate(10.0)
    assert t.scale == pytest.approx(2.0) and t.mean_rate == pytest.approx(10.0)
    with pytest.raises(ValueError):
        ArrivalSpec(ArrivalKind.OFFLINE).with_rate(1.0)


def test_paper_preset():
    assert PAPER_AZURE_CV == pytest.approx(1.6926, abs=1e-3)
    sharegpt = paper_azure_gamma("sharegpt")
    assert 1 / sharegpt.rate == pytest.approx(0.011075)  # gaps halved
    assert 1 / paper_azure_gamma("leval").rate == pytest.approx(0.0443)  # doubled
    assert paper_azure_gamma("sharegpt", scale=2.0).rate == pytest.approx(2 * sharegpt.rate)


def test_invalid_specs():
    with pytest.raises(ValueError):
        ArrivalSpec(ArrivalKind.POISSON)
    with pytest.raises(ValueError):
        ArrivalSpec(ArrivalKind.GAMMA, rate=1.0, cv=0.0)
    with pytest.raises(ValueError):
        ArrivalSpec(ArrivalKind.TRACE)


def test_scale_applies_to_every_process():
    base = ArrivalSpec(ArrivalKind.GAMMA, rate=10.0, cv=2.0)
    fast = ArrivalSpec(ArrivalKind.GAMMA, rate=10.0, cv=2.0, scale=2.5)
    np.testing.assert_allclose(arrival_offsets(fast, 20, 4) * 2.5, arrival_offsets(base, 20, 4))
    assert fast.mean_rate == pytest.approx(25.0)
    assert fast.with_rate(5.0).mean_rate == pytest.approx(5.0)
