"""Pre-tokenized workloads: requests saved as token ids, for machines without the datasets.

Format (also what benchmarks/prepare_workload.py writes):
    {"requests": [[[prompt token ids...], output_len], ...], ...anything else}
"""

from __future__ import annotations

import json
from pathlib import Path

from kvtier.bench.request import BenchRequest, LengthLimits, LengthReport, OutsideAction


def load_prepared(path: Path | str, num_requests: int, limits: LengthLimits) -> list[BenchRequest]:
    """The first `num_requests` saved requests inside `limits`, in file order, arrival 0."""
    return load_prepared_reported(path, num_requests, limits)[0]


def load_prepared_reported(path: Path | str, num_requests: int,
                           limits: LengthLimits) -> tuple[list[BenchRequest], LengthReport]:
    """`load_prepared`, and how many requests before the last one taken were dropped."""
    rows = json.loads(Path(path).read_text())["requests"]
    requests, dropped = [], 0
    for ids, output_len in rows:
        if limits.accepts(len(ids), output_len):
            requests.append(BenchRequest(tuple(ids), int(output_len)))
            if len(requests) == num_requests:
                return requests, LengthReport(limits, dropped, OutsideAction.DROPPED)
        else:
            dropped += 1
    raise ValueError(f"{path}: only {len(requests)} of {len(rows)} requests fit {limits}; "
                     f"asked for {num_requests}")


def prepared_dataset(path: Path | str) -> str | None:
    """The dataset a prepared file was sampled from ("sharegpt", "leval", ...), if it says."""
    doc = json.loads(Path(path).read_text())
    name = (doc.get("spec") or {}).get("dataset") or doc.get("dataset")
    if not isinstance(name, str):
        return None
    for known in ("sharegpt", "leval", "azure", "synthetic"):
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
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(payload, separators=(",", ":")))
