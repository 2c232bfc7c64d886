"""Measured-time curves the cost model interpolates: 1-D over a size, 2-D over (batch, context).

Interpolation is linear in log(size)-log(time): GEMM and attention times span four decades
and are close to power laws between neighbouring points. Outside the measured range a curve
is clamped below (a launch floor does not shrink) and proportional above (past the largest
point every operator here is bound by FLOPs or bytes, both linear in the size).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Curve:
    keys: tuple[float, ...]  # increasing
    seconds: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.seconds) or not self.keys:
            raise ValueError("a curve needs matching, non-empty keys and times")
        if any(b <= a for a, b in zip(self.keys, self.keys[1:])):
            raise ValueError(f"curve keys must increase: {self.keys}")
        if any(t <= 0 for t in self.seconds) or any(k <= 0 for k in self.keys):
            raise ValueError("curve keys and times must be positive")

    @classmethod
    def from_points(cls, points: list[tuple[float, float]]) -> Curve:
        """Points (key, seconds); repeated keys keep their median time."""
        by_key: dict[float, list[float]] = {}
        for k, t in points:
            by_key.setdefault(float(k), []).append(float(t))
        keys = sorted(by_key)
        return cls(tuple(keys), tuple(_median(by_key[k]) for k in keys))

    def at(self, key: float) -> float:
        ks, ts = self.keys, self.seconds
        if key <= ks[0]:
            return ts[0]
        if key >= ks[-1]:
            return ts[-1] * key / ks[-1]
        i = bisect.bisect_right(ks, key)
        if ks[i - 1] == key:
            return ts[i - 1]
        return _loglog(key, ks[i - 1], ks[i], ts[i - 1], ts[i])

    def to_json(self) -> list[list[float]]:
        return [[k, t] for k, t in zip(self.keys, self.seconds)]

    @classmethod
    def from_json(cls, rows: list[list[float]]) -> Curve:
        return cls.from_points([(k, t) for k, t in rows])


@dataclass(frozen=True)
class Grid:
    """Time over (rows, mean context): one curve over context per measured row count."""

    rows: tuple[float, ...]
    curves: tuple[Curve, ...]

    @classmethod
    def from_points(cls, points: list[tuple[float, float, float]]) -> Grid:
        """Points (rows, context, seconds)."""
        by_rows: dict[float, list[tuple[float, float]]] = {}
        for b, c, t in points:
            by_rows.setdefault(float(b), []).append((c, t))
        rows = sorted(by_rows)
        return cls(tuple(rows), tuple(Curve.from_points(by_rows[b]) for b in rows))

    def at(self, rows: float, ctx: float) -> float:
        rs = self.rows
        if rows <= rs[0]:
            return self.curves[0].at(ctx)
        if rows >= rs[-1]:
            return self.curves[-1].at(ctx) * rows / rs[-1]
        i = bisect.bisect_right(rs, rows)
        if rs[i - 1] == rows:
            return self.curves[i - 1].at(ctx)
        lo, hi = self.curves[i - 1].at(ctx), self.curves[i].at(ctx)
        return _loglog(rows, rs[i - 1], rs[i], lo, hi)

    def to_json(self) -> list[list[float]]:
        return [[b, k, t] for b, c in zip(self.rows, self.curves)
                for k, t in zip(c.keys, c.seconds)]

    @classmethod
    def from_json(cls, rows: list[list[float]]) -> Grid:
        return cls.from_points([(b, k, t) for b, k, t in rows])


def _loglog(x: float, x0: float, x1: float, y0: float, y1: float) -> float:
    w = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


def _median(values: list[float]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
