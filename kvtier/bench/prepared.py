"""Pre-tokenized workloads: requests saved as token ids, for machines without the datasets.

Format (also what benchmarks/prepare_workload.py writes):
    {"requests": [[[prompt token ids...], output_len], ...], ...anything else}
and for a workload with follow-ups (multi-turn), two lists beside it, one entry a request:
    "follows": [index of the request it follows, or null, ...], "think_s": [seconds, ...]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvtier.bench.data_file import DataFileError, read_text, whole_json
from kvtier.bench.request import BenchRequest, LengthLimits, LengthReport, OutsideAction


def load_prepared(path: Path | str, num_requests: int, limits: LengthLimits) -> list[BenchRequest]:
    """The first `num_requests` saved requests inside `limits`, in file order, arrival 0."""
    return load_prepared_reported(path, num_requests, limits)[0]


def load_prepared_reported(path: Path | str, num_requests: int,
                           limits: LengthLimits) -> tuple[list[BenchRequest], LengthReport]:
    """`load_prepared`, and how many requests before the last one taken were dropped.

    A dropped request's follow-ups follow what it followed (its conversation goes on
    without that turn), so every kept follow-up still follows an earlier kept request."""
    rows, follows, think = _columns(_document(path), path)
    requests: list[BenchRequest] = []
    kept_as: list[int | None] = []  # file index -> the kept request that stands for it
    dropped = 0
    for (ids, output_len), parent, think_s in zip(rows, follows, think):
        after = None if parent is None else kept_as[parent]  # _columns checked it is earlier
        if limits.accepts(len(ids), output_len):
            kept_as.append(len(requests))
            requests.append(BenchRequest(tuple(ids), int(output_len), follows=after,
                                         think_s=float(think_s) if after is not None else 0.0))
            if len(requests) == num_requests:
                return requests, LengthReport(limits, dropped, OutsideAction.DROPPED)
        else:
            kept_as.append(after)
            dropped += 1
    raise ValueError(f"{path}: only {len(requests)} of {len(rows)} requests fit {limits}; "
                     f"asked for {num_requests} (--num-prompts)")


def _document(path: Path | str) -> dict:
    doc = whole_json(read_text(path, "requests"))
    if not isinstance(doc, dict) or not isinstance(doc.get("requests"), list):
        raise DataFileError(path, "not a prepared workload: a JSON object whose 'requests' "
                                  "lists [[prompt token ids], output_len] pairs "
                                  "(what --save-workload writes)")
    return doc


def _columns(doc: dict, path: Path | str) -> tuple[list, list, list]:
    """The requests, what each follows and its think time, each checked, so a bad entry is
    named by its index instead of failing deep in the loop."""
    rows = doc["requests"]
    follows = doc.get("follows") or [None] * len(rows)
    think = doc.get("think_s") or [0.0] * len(rows)
    if len(follows) != len(rows) or len(think) != len(rows):
        raise DataFileError(path, f"{len(rows)} requests, {len(follows)} follows, "
                                  f"{len(think)} think_s entries")
    for i, (row, parent, think_s) in enumerate(zip(rows, follows, think)):
        if not _is_request(row):
            raise DataFileError(path, f"request {i} is {str(row)[:60]}, not "
                                      "[[prompt token ids], output_len]")
        if parent is not None and not (isinstance(parent, int) and 0 <= parent < i):
            raise DataFileError(path, f"request {i} follows {parent!r}: not an earlier request")
        if not isinstance(think_s, (int, float)):
            raise DataFileError(path, f"request {i} has think_s {think_s!r}: not seconds")
    return rows, follows, think


def _is_request(row: Any) -> bool:
    return (isinstance(row, list) and len(row) == 2 and isinstance(row[0], list)
            and all(isinstance(t, int) for t in row[0])
            and (isinstance(row[1], int) or isinstance(row[1], float) and row[1].is_integer()))


def prepared_dataset(path: Path | str) -> str | None:
    """The dataset a prepared file was sampled from ("sharegpt", "leval", ...), if it says."""
    doc = _document(path)
    spec = doc.get("spec")
    name = (spec.get("dataset") if isinstance(spec, dict) else None) or doc.get("dataset")
    if not isinstance(name, str):
        return None
    # Longer names first: "sharegpt-multiturn" is not "sharegpt".
    for known in ("sharegpt-multiturn", "generated-shared-prefix", "sharegpt", "leval", "azure",
                  "mooncake", "burstgpt", "synthetic"):
        if name.lower().startswith(known):
            return known
    return None


def save_prepared(requests: tuple[BenchRequest, ...] | list[BenchRequest], path: Path | str,
                  meta: dict | None = None) -> None:
    payload = {
        **(meta or {}),
        "requests": [[list(r.prompt_token_ids), r.output_len] for r in requests],
        "arrival_s": [r.arrival_s for r in requests],
    }
    if any(r.follows is not None for r in requests):
        payload["follows"] = [r.follows for r in requests]
        payload["think_s"] = [r.think_s for r in requests]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, separators=(",", ":")))
