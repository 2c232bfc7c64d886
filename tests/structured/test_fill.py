"""A step's masks: filled row by row or on xgrammar's threads (large batches), they are
the masks each sequence's own matcher gives, with ended rows open and min_tokens' ends held."""

from __future__ import annotations

import numpy as np
import pytest

from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.sampling_params import SamplingParams
from kvtier.structured.backend import BATCH_FILL_MIN_ROWS
from kvtier.structured.fill_choice import FillChoice
from kvtier.structured.requests import StructuredRequests
from kvtier.tokenizer import BPETokenizer

pytest.importorskip("xgrammar")

VOCAB = 4096
REPLY = '{"name": "Ada", "age": 36}'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def _step(batch: int, min_tokens: int = 0, spec: dict | None = None, reply: str = REPLY,
          threaded: bool | None = None):
    """`batch` sequences advanced into `reply` and its end token, the first to the end (it
    ended), the next one token less, ...; their plan, and the grammars (large fills on
    xgrammar's threads or not, as `threaded` says; None: as the backend chooses)."""
    tok = BPETokenizer(VOCAB)
    grammars = StructuredRequests(tok, VOCAB)
    grammars.backend.fill_choice = FillChoice(BATCH_FILL_MIN_ROWS, fixed=threaded)
    params = SamplingParams(structured_outputs=spec or {"json": SCHEMA}, min_tokens=min_tokens)
    compiled = grammars.compile(params)
    ids = tok.encode(reply) + [tok.eos_token_ids[0]]
    seqs = {}
    for i in range(batch):
        seq = grammars.sequence(compiled, params, tok.eos_token_ids)
        for t in ids[:len(ids) - i % (len(ids) + 1)]:
            seq.accept(t)
        seqs[str(i)] = seq
    plan = StepPlan([ScheduledRequest(str(i), [1], 10, ((),), False, True, params, i % 3)
                     for i in range(batch)])
    return grammars, plan, seqs, tok


def _own_mask(seq, words: int) -> np.ndarray:
    want = np.zeros((1, words), dtype=np.int32)
    if seq.matcher.is_terminated():
        return np.full(words, -1, dtype=np.int32)
    seq.matcher.fill_next_token_bitmask(want, 0)
    return want[0]


@pytest.mark.parametrize("threaded", [True, False])
@pytest.mark.parametrize("batch", [3, BATCH_FILL_MIN_ROWS, 3 * BATCH_FILL_MIN_ROWS + 1])
def test_each_row_gets_its_own_matchers_mask(batch, threaded):
    grammars, plan, seqs, _ = _step(batch, threaded=threaded)
    grammars.fill(plan, seqs.get)
    words = grammars.backend.mask_words
    assert any(s.matcher.is_terminated() for s in seqs.values())  # ended rows are covered
    for sr in plan.scheduled:
        assert np.array_equal(sr.token_mask, _own_mask(seqs[sr.request_id], words)), sr.request_id


def _bits(mask: np.ndarray, tokens) -> list[bool]:
    words = mask.view(np.uint32)
    return [bool((words[t >> 5] >> np.uint32(t & 31)) & 1) for t in tokens]


@pytest.mark.parametrize("threaded", [True, False])
def test_min_tokens_holds_the_ends_either_way(threaded):
    # a word of letters may end after any letter: its masks allow the end beside more
    grammars, plan, seqs, tok = _step(2 * BATCH_FILL_MIN_ROWS, min_tokens=1,
                                      spec={"regex": "[a-z]+"}, reply="structured",
                                      threaded=threaded)
    grammars.fill(plan, seqs.get)
    ends = list(tok.eos_token_ids)
    held = 0
    for sr in plan.scheduled:
        seq = seqs[sr.request_id]
        own = _own_mask(seq, grammars.backend.mask_words)
        without_ends = own.view(np.uint32).copy()
        for t in ends:
            without_ends[t >> 5] &= ~np.uint32(1 << (t & 31))
        if seq.matcher.is_terminated() or sr.num_output_tokens >= 1 or not without_ends.any():
            assert np.array_equal(sr.token_mask, own)  # nothing to hold, or it must end
        else:
            assert np.array_equal(sr.token_mask.view(np.uint32), without_ends)
            held += any(_bits(own, ends))
    assert held  # some row's grammar allowed an end that min_tokens held back
