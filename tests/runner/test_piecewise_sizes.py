"""Padded token counts of the piecewise graphs: fine enough that padding stays small."""

from kvtier.core.graph_sizes import piecewise_sizes


def test_sizes_are_multiples_of_32_and_end_at_the_budget():
    sizes = piecewise_sizes(8192)
    assert sizes == sorted(set(sizes)) and sizes[-1] == 8192
    assert all(s % 32 == 0 for s in sizes)
    assert sizes[:16] == list(range(32, 513, 32))


def test_padding_is_at_most_an_eighth_past_512_tokens():
    sizes = piecewise_sizes(8192)
    for n in range(1, 8193):
        t = next(s for s in sizes if s >= n)
        assert t - n < 32 or (t - n) / n <= 0.125, (n, t)


def test_small_budgets():
    assert piecewise_sizes(16) == [16]
    assert piecewise_sizes(100) == [32, 64, 96, 100]
