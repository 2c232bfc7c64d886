"""The Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens).

Three ways to use it, as two orthogonal choices of `kvtier bench`:
- replay:       lengths from the trace (`--workload azure`) + its arrival times (`--arrivals trace`);
- lengths only: `--workload azure` with any other arrival process;
- gaps only:    any other workload with `--arrivals trace`.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import numpy as np

from kvtier.bench.request import LengthLimits, LengthReport, OutsideAction


@dataclass(frozen=True)
class AzureTrace:
    timestamps_s: np.ndarray  # [n] seconds since the first request, non-decreasing
    context_tokens: np.ndarray  # [n]
    generated_tokens: np.ndarray  # [n]

    def __len__(self) -> int:
        return len(self.timestamps_s)

    def window(self, start: int, num: int) -> AzureTrace:
        """Requests [start, start + num), timestamps re-based to the window's first."""
        if start < 0 or num < 1 or start + num > len(self):
            raise ValueError(f"window [{start}, {start + num}) is outside a trace of {len(self)}")
        ts = self.timestamps_s[start : start + num]
        return AzureTrace(
            ts - ts[0],
            self.context_tokens[start : start + num],
            self.generated_tokens[start : start + num],
        )

    def gaps_s(self) -> np.ndarray:
        return np.diff(self.timestamps_s)

    def lengths(self, limits: LengthLimits) -> list[tuple[int, int]]:
        """(prompt, output) per request, clipped (not dropped) so the arrival rate is kept."""
        return [limits.clip(int(c), int(g)) for c, g in zip(self.context_tokens, self.generated_tokens)]

    def lengths_reported(self, limits: LengthLimits) -> tuple[list[tuple[int, int]], LengthReport]:
        """`lengths`, and how many requests the limits clipped."""
        lengths = self.lengths(limits)
        raw = zip(self.context_tokens.tolist(), self.generated_tokens.tolist())
        clipped = sum(got != tuple(was) for got, was in zip(lengths, raw))
        return lengths, LengthReport(limits, clipped, OutsideAction.TRUNCATED)


def _parse_timestamp(text: str) -> tuple[int, float]:
    """(whole epoch seconds, fraction). The trace has 7 fractional digits: more than
    datetime parses, and finer than a float64 of epoch seconds resolves."""
    base, _, frac = text.strip().partition(".")
    seconds = int(datetime.strptime(base, "%Y-%m-%d %H:%M:%S").timestamp())
    return seconds, float("0." + frac) if frac else 0.0


def load_azure_trace(path: Path | str) -> AzureTrace:
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise ValueError(f"{path}: empty trace")
    missing = {"TIMESTAMP", "ContextTokens", "GeneratedTokens"} - set(rows[0])
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    stamps = [_parse_timestamp(r["TIMESTAMP"]) for r in rows]
    first = min(whole for whole, _ in stamps)
    ts = np.array([(whole - first) + frac for whole, frac in stamps])
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    ctx = np.array([int(r["ContextTokens"]) for r in rows])[order]
    gen = np.array([int(r["GeneratedTokens"]) for r in rows])[order]
    return AzureTrace(ts - ts[0], ctx, gen)


def gap_statistics(trace: AzureTrace) -> tuple[float, float]:
    """(mean gap in seconds, coefficient of variation): the gamma process that mimics the trace."""
    gaps = trace.gaps_s()
    mean = float(gaps.mean())
    return mean, float(gaps.std() / mean)
