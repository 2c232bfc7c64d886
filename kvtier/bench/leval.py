"""L-Eval JSONL (e.g. the paper-assistant task): a long `input` document, several `instructions`.

One request per instruction, prompt = the document then the instruction, output length =
the token count of the reference answer in `outputs`. Instructions on the same document
share its tokens as an exact prefix, so this is also a shared-prefix workload.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer

# L-Eval's own baselines put a system line before the document; ours names the task the same way.
_HEADER = (
    "Now you are given a very long document. Please follow the instruction after this "
    "document.\n\nDocument:\n"
)
LEVAL_LIMITS = LengthLimits(max_prompt_len=None, max_total_len=None)


@dataclass(frozen=True)
class LEvalRecord:
    document: str
    instructions: tuple[str, ...]
    outputs: tuple[str, ...]


def load_leval(path: Path | str) -> list[LEvalRecord]:
    records = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            instructions, outputs = row["instructions"], row["outputs"]
            if len(instructions) != len(outputs):
                raise ValueError(f"{path}:{line_no}: {len(instructions)} instructions, {len(outputs)} outputs")
            records.append(LEvalRecord(row["input"], tuple(instructions), tuple(outputs)))
    return records


def sample_leval(
    records: list[LEvalRecord],
    tokenizer: Tokenizer,
    num_requests: int | None,
    seed: int,
    limits: LengthLimits = LEVAL_LIMITS,
    max_document_tokens: int | None = None,
) -> list[BenchRequest]:
    """Requests from a seeded shuffle of the documents, each document's instructions in order.

    `max_document_tokens` keeps the first tokens of each document (small models, short
    context windows); the cut document is still one prefix shared by its instructions.
    """
    order = list(range(len(records)))
    random.Random(seed).shuffle(order)
    requests: list[BenchRequest] = []
    for idx in order:
        record = records[idx]
        # Document and instruction are tokenized apart so the shared prefix is token-exact:
        # BPE over the concatenation could merge across the boundary differently per question.
        doc_ids = tokenizer.encode(_HEADER + record.document)[:max_document_tokens]
        for instruction, reference in zip(record.instructions, record.outputs):
            prompt_ids = doc_ids + tokenizer.encode(f"\n\nInstruction: {instruction}\nAnswer:")
            output_len = len(tokenizer.encode(reference))
            if limits.accepts(len(prompt_ids), output_len):
                requests.append(BenchRequest(tuple(prompt_ids), output_len))
            if num_requests is not None and len(requests) == num_requests:
                return requests
    if num_requests is not None:
        raise ValueError(
            f"only {len(requests)} L-Eval requests fit {limits}; asked for {num_requests} "
            "(raise --max-model-len / --max-total-len or cut documents: --leval-max-document-tokens)"
        )
    return requests
