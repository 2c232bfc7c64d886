import numpy as np
import pytest

from kvtier.bench.backend import RequestRecord
from kvtier.bench.metrics import (
    Distribution,
    Slo,
    concurrency_timeline,
    mean_concurrency,
    summarize,
)


def rec(rid, arrival, token_times, prompt_len=10, reason="length", error=None):
    token_times = tuple(token_times)
    return RequestRecord(
        request_id=rid, prompt_len=prompt_len, expected_output_len=len(token_times),
        arrival_s=arrival, first_token_s=token_times[0] if token_times else None,
        token_times_s=token_times, finish_s=token_times[-1] if token_times else None,
        finish_reason=reason, error=error,
    )


# Three requests, worked out by hand:
#   a: arrives 0.0, tokens at 1.0, 1.5, 2.5     -> TTFT 1.0, E2E 2.5, TPOT (2.5-1)/2 = 0.75, ITLs .5, 1.0
#   b: arrives 1.0, tokens at 1.2, 1.4          -> TTFT 0.2, E2E 0.4, TPOT 0.2,               ITL  .2
#   c: arrives 2.0, one token at 4.0            -> TTFT 2.0, E2E 2.0, TPOT undefined
RECORDS = [rec("a", 0.0, [1.0, 1.5, 2.5], 10), rec("b", 1.0, [1.2, 1.4], 20), rec("c", 2.0, [4.0], 30)]


def test_record_latencies():
    a, b, c = RECORDS
    assert (a.ttft_s, a.e2e_s, a.tpot_s) == (1.0, 2.5, 0.75)
    assert a.itls_s() == [0.5, 1.0]
    assert b.tpot_s == pytest.approx(0.2)
    assert c.tpot_s is None and c.itls_s() == []


def test_distribution_hand_computed():
    d = Distribution.of([1.0, 2.0, 3.0, 4.0, 10.0])
    assert (d.count, d.mean, d.p50, d.max) == (5, 4.0, 3.0, 10.0)
    assert d.p90 == pytest.approx(4.0 + 0.6 * 6.0)  # linear interpolation between 4 and 10
    assert d.p99 == pytest.approx(4.0 + 0.96 * 6.0)
    assert Distribution.of([]) is None


def test_summary_hand_computed():
    s = summarize(RECORDS, duration_s=4.0)
    assert s.num_completed == 3
    assert s.request_throughput == pytest.approx(3 / 4.0)
    assert s.output_throughput == pytest.approx(6 / 4.0)
    assert s.total_token_throughput == pytest.approx((6 + 60) / 4.0)
    assert s.ttft_s.mean == pytest.approx((1.0 + 0.2 + 2.0) / 3) and s.ttft_s.p50 == pytest.approx(1.0)
    assert s.tpot_s.count == 2 and s.tpot_s.mean == pytest.approx((0.75 + 0.2) / 2)
    assert s.itl_s.count == 3 and s.itl_s.mean == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert s.e2e_s.p50 == pytest.approx(2.0) and s.e2e_s.max == pytest.approx(2.5)
    assert s.slo_attainment is None


def test_queue_time_where_the_backend_reports_when_it_scheduled():
    from dataclasses import replace
    assert summarize(RECORDS, duration_s=4.0).queue_s is None  # not reported (a server client)
    stamped = [replace(r, first_scheduled_s=r.arrival_s + wait)
               for r, wait in zip(RECORDS, (0.5, 0.0, 1.5))]
    q = summarize(stamped, duration_s=4.0).queue_s
    assert q.count == 3 and q.p50 == pytest.approx(0.5) and q.max == pytest.approx(1.5)
    assert stamped[0].rebased(0.25).queue_s == pytest.approx(0.5)


def test_slo_attainment_hand_computed():
    s = summarize(RECORDS, 4.0, Slo(ttft_s=1.0, tpot_s=0.5))
    # a: TTFT ok, TPOT 0.75 > 0.5 -> miss; b: both ok; c: TTFT 2.0 > 1.0 -> miss.
    assert s.slo_attainment == pytest.approx(1 / 3)
    assert s.ttft_attainment == pytest.approx(2 / 3)
    assert s.tpot_attainment == pytest.approx(2 / 3)  # a misses; c has no TPOT: meets that half
    assert s.slo_throughput == pytest.approx(1 / 4.0)


def test_failed_requests_count_against_slo_and_not_throughput():
    failed = rec("d", 0.5, [], error="rejected")
    aborted = rec("e", 0.5, [0.6, 0.7], reason="abort")
    s = summarize(RECORDS + [failed, aborted], 4.0, Slo(ttft_s=10.0, tpot_s=10.0))
    assert s.num_requests == 5 and s.num_completed == 3
    assert s.slo_attainment == pytest.approx(3 / 5)
    assert s.output_throughput == pytest.approx(6 / 4.0)


def test_concurrency_hand_computed():
    times, counts = concurrency_timeline(RECORDS)
    # events: 0 +a, 1.0 +b, 1.4 -b, 2.0 +c, 2.5 -a, 4.0 -c
    np.testing.assert_allclose(times, [0.0, 1.0, 1.4, 2.0, 2.5, 4.0])
    np.testing.assert_array_equal(counts, [1, 2, 1, 2, 1, 0])
    expected = (1 * 1.0 + 2 * 0.4 + 1 * 0.6 + 2 * 0.5 + 1 * 1.5) / 4.0
    assert mean_concurrency(times, counts) == pytest.approx(expected)
    s = summarize(RECORDS, 4.0)
    assert s.max_concurrency == 2 and s.mean_concurrency == pytest.approx(expected)


def test_departure_before_arrival_at_same_instant():
    times, counts = concurrency_timeline([rec("x", 0.0, [1.0]), rec("y", 1.0, [2.0])])
    assert counts.max() == 1


def test_unsent_requests_are_counted_apart_from_attainment():
    """A run cut by --max-duration: the requests still due were never asked of the engine."""
    from dataclasses import replace

    aborted = rec("e", 0.5, [0.6, 0.7], reason="abort")
    failed = rec("d", 0.5, [], error="rejected")
    unsent = [replace(rec(f"u{i}", 9.0, [], reason=None, error="not sent"), sent=False)
              for i in range(5)]
    s = summarize(RECORDS + [aborted, failed] + unsent, 4.0, Slo(ttft_s=10.0, tpot_s=10.0))
    assert (s.num_requests, s.num_sent, s.num_completed) == (10, 5, 3)
    assert (s.num_aborted_at_limit, s.num_failed, s.num_not_sent) == (1, 1, 5)
    assert s.slo_attainment == pytest.approx(3 / 5)  # of the 5 sent
    assert s.slo_attainment_all == pytest.approx(3 / 10)  # the strict figure, under its name
    assert s.ttft_attainment == pytest.approx(3 / 5)
    assert s.slo_throughput == pytest.approx(3 / 4.0)
    assert "sent" in s.to_dict()["attainment_basis"]


def test_table_says_what_attainment_is_of():
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from kvtier.bench.table import print_table

    def result(records):
        summary = summarize(records, 4.0, Slo(ttft_s=10.0))
        return SimpleNamespace(policy="p", summary=summary, goodput=None, engine={})

    from dataclasses import replace

    cut = RECORDS + [replace(rec("u", 9.0, [], reason=None, error="not sent"), sent=False)]
    buf = io.StringIO()
    print_table([result(cut)], console=Console(file=buf, width=300))
    text = buf.getvalue()
    assert "SLO % sent" in text and "not sent" in text and "SLO % all" in text
    assert "100.0" in text and "75.0" in text  # 3 of 3 sent, 3 of 4 in all
    buf = io.StringIO()
    print_table([result(RECORDS)], console=Console(file=buf, width=300))
    assert "SLO % sent" in buf.getvalue() and "not sent" not in buf.getvalue()
