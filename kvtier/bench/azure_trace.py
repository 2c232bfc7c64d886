"""The Azure LLM inference trace (CSV: TIMESTAMP, ContextTokens, GeneratedTokens), and
BurstGPT's in the same form (`load_burstgpt_trace`).

Three ways to use it, as two orthogonal choices of `kvtier bench`:
- replay:       lengths from the trace (`--workload azure`) + its arrival times (`--arrivals trace`);
- lengths only: `--workload azure` with any other arrival process;
- gaps only:    any other workload with `--arrivals trace`.
"""

from __future__ import annotations

import calendar
import csv
import io
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvtier.bench.data_file import DataFileError, read_text
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


_STAMP = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2})(?:\.(\d+))?\s*"
                    r"(Z|[+-]\d{2}:?\d{2})?")


def _parse_timestamp(text: str) -> tuple[int, float]:
    """(whole epoch seconds, fraction). The 2023 traces have 7 fractional digits: more than
    datetime parses, and finer than a float64 of epoch seconds resolves; the 2024 ones end in
    a UTC offset (`+00:00`). A stamp without an offset is taken as UTC."""
    m = _STAMP.fullmatch(text.strip())
    if m is None:
        raise ValueError(f"timestamp {text!r} is not 'YYYY-MM-DD HH:MM:SS[.fraction][offset]'")
    day, clock, frac, zone = m.groups()
    seconds = calendar.timegm(time.strptime(f"{day} {clock}", "%Y-%m-%d %H:%M:%S"))
    if zone and zone != "Z":
        sign = -1 if zone[0] == "+" else 1  # 12:00+02:00 is 10:00 UTC
        digits = zone[1:].replace(":", "")
        seconds += sign * (int(digits[:2]) * 3600 + int(digits[2:]) * 60)
    return seconds, float("0." + frac) if frac else 0.0


def _row(r: dict[str, str], path: Path | str, line: int) -> tuple[tuple[int, float], int, int]:
    try:
        return (_parse_timestamp(r["TIMESTAMP"]), int(r["ContextTokens"]),
                int(r["GeneratedTokens"]))
    except (ValueError, TypeError) as e:
        raise DataFileError(path, str(e), line) from None


def _csv_rows(path: Path | str, columns: set[str]) -> list[dict[str, str]]:
    """The CSV's rows by header name, after checking `columns` are in the header."""
    rows = list(csv.DictReader(io.StringIO(read_text(path, "trace rows"), newline="")))
    if not rows:
        raise DataFileError(path, "empty trace (a header and no rows)")
    missing = columns - set(rows[0])
    if missing:
        raise DataFileError(path, f"missing columns {sorted(missing)}; has {sorted(rows[0])}")
    return rows


def load_azure_trace(path: Path | str) -> AzureTrace:
    rows = _csv_rows(path, {"TIMESTAMP", "ContextTokens", "GeneratedTokens"})
    parsed = [_row(r, path, i) for i, r in enumerate(rows, 2)]  # line 1 is the header
    first = min(whole for (whole, _), _, _ in parsed)
    ts = np.array([(whole - first) + frac for (whole, frac), _, _ in parsed])
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    ctx = np.array([c for _, c, _ in parsed])[order]
    gen = np.array([g for _, _, g in parsed])[order]
    if (ctx < 0).any() or (gen < 0).any():
        raise DataFileError(path, "negative token counts")
    return AzureTrace(ts - ts[0], ctx, gen)


BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


def load_burstgpt_trace(path: Path | str) -> AzureTrace:
    """BurstGPT's trace (CSV: Timestamp in seconds, Model, Request tokens, Response tokens,
    Total tokens, Log Type; v2 adds Session ID and Elapsed time), in the Azure trace's
    form. Failed requests (0 response tokens, the trace's failures) and empty requests are
    left out, as vLLM's BurstGPT dataset leaves them."""
    rows = _csv_rows(path, set(BURSTGPT_COLUMNS))
    kept = []
    for line, r in enumerate(rows, 2):
        try:
            t, req, resp = (float(r["Timestamp"]), int(r["Request tokens"]),
                            int(r["Response tokens"]))
        except (ValueError, TypeError) as e:
            raise DataFileError(path, str(e), line) from None
        if req > 0 and resp > 0:
            kept.append((t, req, resp))
    if not kept:
        raise DataFileError(path, "no request with tokens both ways")
    kept.sort(key=lambda row: row[0])
    ts = np.array([t for t, _, _ in kept])
    return AzureTrace(ts - ts[0], np.array([q for _, q, _ in kept]),
                      np.array([g for _, _, g in kept]))


def load_trace_csv(path: Path | str) -> AzureTrace:
    """An Azure or a BurstGPT trace, by its header."""
    header = next(csv.reader(io.StringIO(read_text(path, "trace rows"), newline="")), [])
    return load_burstgpt_trace(path) if "Request tokens" in header else load_azure_trace(path)


def gap_statistics(trace: AzureTrace) -> tuple[float, float]:
    """(mean gap in seconds, coefficient of variation): the gamma process that mimics the trace."""
    gaps = trace.gaps_s()
    mean = float(gaps.mean())
    return mean, float(gaps.std() / mean)
