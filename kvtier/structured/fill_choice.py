"""Whether a large step's masks are filled on xgrammar's threads or one row after another,
chosen by what each way has cost here lately.

Threads pay where one row's fill is expensive (a JSON schema's) and cost where it is cheap (a
regex's: the hand-offs outweigh the work); which holds depends on the grammars being served
and on the host (results/gpu_path/structured_overhead_h200_75f8e2a.json against
structured_overhead_serial_fill_h200_75f8e2a.json). So from `min_rows` rows on both ways are
timed: each keeps a moving average of its cost a row, the cheaper one fills, and every
`probe_every` large fills the other is tried once, so a change in the mix is seen (a way
left unused for longer than that, or timed at NEW_MIX times its average or more, starts its
average afresh: the old one is stale). One choice serves the backend's whole mix of
grammars, and rows of any count are compared by their cost a row. Either way fills the same masks; only the time differs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

SMOOTHING = 0.2  # weight of the newest fill in a way's moving average
# A fill this many times dearer or cheaper than its way's average is a new mix of grammars,
# not noise: it replaces the average.
NEW_MIX = 2.0


@dataclass
class FillChoice:
    min_rows: int  # below, always one row after another
    probe_every: int = 32
    fixed: bool | None = None  # always this way from min_rows on (benchmarks, tests)
    per_row_s: dict[bool, float] = field(default_factory=dict)  # threaded? -> s a row
    _fills: int = 0
    _seen: dict[bool, int] = field(default_factory=dict)  # way -> the fill it last timed

    def threaded(self, num_rows: int) -> bool:
        """Whether to fill `num_rows` rows on the threads."""
        if num_rows < self.min_rows:
            return False
        if self.fixed is not None:
            return self.fixed
        self._fills += 1
        for way in (True, False):  # each way timed once before any comparison
            if way not in self.per_row_s:
                return way
        best = self.per_row_s[True] <= self.per_row_s[False]
        return (not best) if self._fills % self.probe_every == 0 else best

    def record(self, threaded: bool, num_rows: int, seconds: float) -> None:
        """The time a large fill took (small ones are not compared)."""
        if num_rows < self.min_rows:
            return
        cost, old = seconds / num_rows, self.per_row_s.get(threaded)
        if (old is not None and self._fills - self._seen[threaded] <= self.probe_every
                and 1 / NEW_MIX < cost / old < NEW_MIX):
            cost = old + SMOOTHING * (cost - old)
        self.per_row_s[threaded] = cost
        self._seen[threaded] = self._fills
