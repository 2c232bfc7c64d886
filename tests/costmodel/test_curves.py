import math

import pytest

from kvtier.costmodel.curves import Curve, Grid


def test_curve_is_exact_at_points_and_power_law_between():
    c = Curve.from_points([(1, 1e-5), (4, 1e-5), (16, 4e-5)])
    assert c.at(4) == 1e-5 and c.at(16) == 4e-5
    assert math.isclose(c.at(8), 2e-5)  # t ~ n between 4 and 16: log-log midpoint
    assert c.at(0.5) == 1e-5  # below: the launch floor does not shrink
    assert math.isclose(c.at(64), 16e-5)  # above: proportional


def test_curve_repeated_keys_take_the_median_and_bad_input_fails():
    c = Curve.from_points([(2, 1.0), (2, 3.0), (2, 2.0), (1, 1.0)])
    assert c.at(2) == 2.0
    with pytest.raises(ValueError):
        Curve((1, 1), (1.0, 2.0))
    with pytest.raises(ValueError):
        Curve((1,), (0.0,))


def test_grid_interpolates_rows_then_context():
    g = Grid.from_points([(1, 100, 1e-5), (1, 400, 2e-5), (4, 100, 2e-5), (4, 400, 8e-5)])
    assert g.at(4, 400) == 8e-5
    assert math.isclose(g.at(2, 100), math.sqrt(1e-5 * 2e-5))
    assert math.isclose(g.at(8, 400), 16e-5)  # more rows than measured: proportional
    assert math.isclose(g.at(4, 1600), 32e-5)  # longer context: proportional


def test_json_round_trip():
    g = Grid.from_points([(1, 100, 1e-5), (4, 400, 8e-5), (4, 100, 2e-5)])
    assert Grid.from_json(g.to_json()) == g
    c = Curve.from_points([(1, 2.0), (3, 4.0)])
    assert Curve.from_json(c.to_json()) == c
