"""Mooncake's request traces (JSON lines: `timestamp` in ms, `input_length`,
`output_length`, `hash_ids`), the traces KV-cache studies replay for prefix reuse: each hash
id stands for one block of `block_size` prompt tokens (512 in Mooncake's releases), and two
requests whose `hash_ids` begin alike share that many leading blocks.

Replayed with random token ids per hash id, the same ids for the same hash whichever request
holds it, so the prompts share exactly the prefixes the trace says; the last block of a
prompt is cut to its `input_length`. Like the Azure trace (kvtier/bench/azure_trace.py),
`--workload mooncake` takes its lengths and prefixes and `--arrivals trace` its gaps.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvtier.bench.data_file import DataFileError, json_lines, read_text
from kvtier.bench.request import BenchRequest, LengthLimits, LengthReport, OutsideAction
from kvtier.bench.synthetic import random_prompt

BLOCK_SIZE = 512  # tokens a hash id stands for in Mooncake's traces


@dataclass(frozen=True)
class MooncakeRequest:
    timestamp_s: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def load_mooncake_trace(path: Path | str) -> list[MooncakeRequest]:
    """The trace's requests in arrival order, timestamps in seconds from the first."""
    lines = json_lines(read_text(path, "trace rows"), path)
    rows = [_row(r, path, line_no) for line_no, r in lines]
    rows.sort(key=lambda r: r.timestamp_s)
    first = rows[0].timestamp_s
    return [MooncakeRequest(r.timestamp_s - first, r.input_length, r.output_length, r.hash_ids)
            for r in rows]


def _row(r: Any, path: Path | str, line_no: int) -> MooncakeRequest:
    try:
        req = MooncakeRequest(float(r["timestamp"]) / 1000.0, int(r["input_length"]),
                              int(r["output_length"]), tuple(int(h) for h in r["hash_ids"]))
    except (ValueError, KeyError, TypeError) as e:
        raise DataFileError(path, f"not a Mooncake trace row ({e!r})", line_no) from None
    if req.input_length < 1 or req.output_length < 0:
        raise DataFileError(path, "input_length must be >= 1 and output_length >= 0", line_no)
    return req


def trace_gaps_s(requests: list[MooncakeRequest]) -> np.ndarray:
    return np.diff([r.timestamp_s for r in requests])


def mooncake_requests(trace: list[MooncakeRequest], limits: LengthLimits, vocab_size: int,
                      seed: int, block_size: int = BLOCK_SIZE
                      ) -> tuple[list[BenchRequest], LengthReport]:
    """One request per trace row: its hash blocks' tokens (the same for the same hash id),
    then, past its blocks, tokens of its own; lengths clipped by `limits` (a clipped prompt
    keeps its leading blocks, so what it shares stays shared)."""
    blocks: dict[int, tuple[int, ...]] = {}

    def block(h: int) -> tuple[int, ...]:
        if h not in blocks:
            rng = np.random.default_rng(np.random.SeedSequence([seed, h & (2**63 - 1)]))
            blocks[h] = random_prompt(rng, block_size, vocab_size)
        return blocks[h]

    own = np.random.default_rng(np.random.SeedSequence([seed, 2**63]))
    out, clipped = [], 0
    for r in trace:
        prompt_len, output_len = limits.clip(r.input_length, r.output_length)
        clipped += (prompt_len, output_len) != (r.input_length, r.output_length)
        tokens: list[int] = []
        for h in r.hash_ids:
            if len(tokens) >= prompt_len:
                break
            tokens += block(h)
        if len(tokens) < prompt_len:  # a row with fewer blocks than its length says
            tokens += random_prompt(own, prompt_len - len(tokens), vocab_size)
        out.append(BenchRequest(tuple(tokens[:prompt_len]), output_len))
    return out, LengthReport(limits, clipped, OutsideAction.TRUNCATED)
