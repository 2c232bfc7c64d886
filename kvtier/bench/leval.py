"""L-Eval JSONL (e.g. the paper-assistant task): a long `input` document, several `instructions`.

One request per instruction, prompt = the document then the instruction, output length =
the token count of the reference answer in `outputs`. Instructions on the same document
share its tokens as an exact prefix, so this is also a shared-prefix workload: `grouped`
sends a paper's instructions one after another (papers in a seeded shuffle), `shuffled`
spreads them over the run (every request in a seeded shuffle), so a hit needs the
document's KV to survive the papers in between.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtier.bench.data_file import DataFileError, json_lines, read_text, whole_json
from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer, describe_rejections

# L-Eval's own baselines put a system line before the document; ours names the task the same way.
_HEADER = (
    "Now you are given a very long document. Please follow the instruction after this "
    "document.\n\nDocument:\n"
)
LEVAL_LIMITS = LengthLimits(max_prompt_len=None, max_total_len=None)


class LEvalOrder(str, enum.Enum):
    GROUPED = "grouped"  # a paper's instructions in a row
    SHUFFLED = "shuffled"  # every (paper, instruction) request in a seeded shuffle


@dataclass(frozen=True)
class LEvalRecord:
    document: str
    instructions: tuple[str, ...]
    outputs: tuple[str, ...]


def load_leval(path: Path | str) -> list[LEvalRecord]:
    """Every record of an L-Eval task file: one JSON object a line with `input`,
    `instructions` and `outputs` (any task: `source`, `evaluation` and other fields are
    left), or the same objects in one JSON array; a malformed record is named by its line
    (its index in an array)."""
    text = read_text(path, "L-Eval records (one JSON object a line)")
    doc = whole_json(text)
    if isinstance(doc, list):  # the records saved as one array (json.dump of a list)
        records = [_record(row, path, f"record {i}") for i, row in enumerate(doc)]
    else:
        rows = [(1, doc)] if isinstance(doc, dict) else json_lines(text, path)
        records = [_record(row, path, "", line) for line, row in rows]
    if not records:
        raise DataFileError(path, "no L-Eval records (one JSON object a line)")
    return records


def _record(row: Any, path: Path | str, where: str, line: int | None = None) -> LEvalRecord:
    problem = _record_problem(row)
    if problem is not None:
        raise DataFileError(path, f"{where}: {problem}" if where else problem, line)
    return LEvalRecord(row["input"], tuple(row["instructions"]), tuple(row["outputs"]))


def _record_problem(row: Any) -> str | None:
    """What keeps `row` from being an L-Eval record; None when it is one."""
    missing = [k for k in ("input", "instructions", "outputs")
               if not isinstance(row, dict) or k not in row]
    if missing:
        return f"an L-Eval record needs 'input', 'instructions' and 'outputs'; missing {missing}"
    document, instructions, outputs = row["input"], row["instructions"], row["outputs"]
    if not isinstance(document, str) or not all(
            isinstance(x, list) and all(isinstance(t, str) for t in x)
            for x in (instructions, outputs)):
        return "'input' must be a string, 'instructions' and 'outputs' lists of strings"
    if len(instructions) != len(outputs):
        return f"{len(instructions)} instructions, {len(outputs)} outputs"
    return None


def sample_leval(
    records: list[LEvalRecord],
    tokenizer: Tokenizer,
    num_requests: int | None,
    seed: int,
    limits: LengthLimits = LEVAL_LIMITS,
    max_document_tokens: int | None = None,
    order: LEvalOrder = LEvalOrder.GROUPED,
) -> list[BenchRequest]:
    """Requests from a seeded shuffle of the documents, each document's instructions in
    order (`grouped`), or all of them shuffled again (`shuffled`: the first `num_requests`
    of that shuffle).

    `max_document_tokens` keeps the first tokens of each document (small models, short
    context windows); the cut document is still one prefix shared by its instructions.
    """
    docs = list(range(len(records)))
    random.Random(seed).shuffle(docs)
    grouped_cap = num_requests if order is LEvalOrder.GROUPED else None
    requests: list[BenchRequest] = []
    dropped: Counter[str] = Counter()  # why, for the error when too few fit
    for idx in docs:
        requests += _document_requests(records[idx], tokenizer, limits, max_document_tokens,
                                       dropped)
        if grouped_cap is not None and len(requests) >= grouped_cap:
            return requests[:grouped_cap]
    if order is LEvalOrder.SHUFFLED:
        random.Random(seed + 1).shuffle(requests)
        if num_requests is not None and len(requests) >= num_requests:
            return requests[:num_requests]
    if num_requests is not None:
        total = sum(len(r.instructions) for r in records)
        raise ValueError(
            f"only {len(requests)} of the {total} L-Eval instructions fit {limits} "
            f"({describe_rejections(dropped)}); asked for {num_requests} (--num-prompts; "
            "long documents can be cut: --leval-max-document-tokens)"
        )
    return requests


def _document_requests(record: LEvalRecord, tokenizer: Tokenizer, limits: LengthLimits,
                       max_document_tokens: int | None,
                       dropped: Counter[str]) -> list[BenchRequest]:
    """One request per instruction inside the limits, in the record's order; `dropped`
    counts the others by the bound they break."""
    # Document and instruction are tokenized apart so the shared prefix is token-exact:
    # BPE over the concatenation could merge across the boundary differently per question.
    doc_ids = tokenizer.encode(_HEADER + record.document)[:max_document_tokens]
    requests = []
    for instruction, reference in zip(record.instructions, record.outputs):
        prompt_ids = doc_ids + tokenizer.encode(f"\n\nInstruction: {instruction}\nAnswer:")
        output_len = len(tokenizer.encode(reference))
        why = limits.rejection(len(prompt_ids), output_len)
        if why is None:
            requests.append(BenchRequest(tuple(prompt_ids), output_len))
        else:
            dropped[why] += 1
    return requests
