"""The fill way chosen by measured cost: each way timed first, then the cheaper one, with
the other probed now and then so a change in the served grammars is seen."""

from __future__ import annotations

from kvtier.structured.fill_choice import FillChoice


def _run(choice: FillChoice, rows: int, cost_a_row: dict[bool, float], fills: int) -> list[bool]:
    ways = []
    for _ in range(fills):
        way = choice.threaded(rows)
        choice.record(way, rows, cost_a_row[way] * rows)
        ways.append(way)
    return ways


def test_small_fills_stay_serial_and_are_not_timed():
    choice = FillChoice(min_rows=64)
    assert _run(choice, 63, {True: 1e-6, False: 1e-3}, 5) == [False] * 5
    assert choice.per_row_s == {}


def test_the_cheaper_way_fills_and_the_other_is_probed():
    choice = FillChoice(min_rows=64, probe_every=8)
    ways = _run(choice, 256, {True: 7e-6, False: 20e-6}, 32)  # a JSON schema's costs
    assert ways[:2] == [True, False]  # each way timed once
    assert ways.count(False) == 1 + 32 // 8  # then only the probes
    choice = FillChoice(min_rows=64, probe_every=8)
    ways = _run(choice, 256, {True: 5.5e-6, False: 4.4e-6}, 32)  # a regex's
    assert ways.count(True) == 1 + 32 // 8


def test_a_change_in_cost_flips_the_choice():
    choice = FillChoice(min_rows=64, probe_every=4)
    _run(choice, 128, {True: 5e-6, False: 20e-6}, 16)
    ways = _run(choice, 128, {True: 30e-6, False: 20e-6}, 16)  # threads now cost more
    assert ways[-4:].count(False) >= 3


def test_a_probe_replaces_the_stale_average():
    choice = FillChoice(min_rows=64, probe_every=8)
    _run(choice, 256, {True: 7e-6, False: 20e-6}, 16)  # JSON's costs: threads
    ways = _run(choice, 256, {True: 5.5e-6, False: 4.4e-6}, 16)  # then a regex's
    first_probe = ways.index(False)
    assert first_probe < 8 and not any(ways[first_probe + 1:first_probe + 7])


def test_a_fixed_way_is_kept():
    assert _run(FillChoice(min_rows=64, fixed=False), 256, {True: 1e-6, False: 1e-3}, 5) == [False] * 5
    assert _run(FillChoice(min_rows=64, fixed=True), 256, {True: 1e-3, False: 1e-6}, 5) == [True] * 5


def test_noisy_timings_keep_the_cheaper_way_most_of_the_time():
    """The faster way's average outlives the probes of the other (a probe does not restart
    it), so one noisy probe does not flip the choice."""
    import random

    rng = random.Random(0)
    choice = FillChoice(min_rows=64, probe_every=16)
    base = {True: 9e-6, False: 10e-6}  # close costs, timed within +-20 %
    ways = []
    for _ in range(2000):
        way = choice.threaded(256)
        choice.record(way, 256, base[way] * rng.uniform(0.8, 1.2) * 256)
        ways.append(way)
    slow = ways.count(False) / len(ways)
    assert slow < 0.1  # the probes (1 in 16) and few wrong turns (restarting the faster
    # way's average at every probe took the slower one on about a fifth of the fills)
