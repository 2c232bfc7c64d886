"""L-Eval with every instruction its own request: grouped or shuffled, the document a
token-exact shared prefix; the paper-assistant file's unshared fraction."""

import json
from pathlib import Path

import pytest

from kvtier.bench.leval import LEvalOrder, load_leval, sample_leval
from kvtier.bench.request import LengthLimits
from kvtier.bench.sharing import prefix_sharing

PAPER_ASSISTANT = Path("/work/shared/data/leval_paper_assistant.jsonl")
LIMITS = LengthLimits(max_prompt_len=None, max_total_len=None)


@pytest.fixture
def leval_file(tmp_path):
    p = tmp_path / "le.jsonl"
    rows = [{"input": f"doc{d} " * (40 + d), "instructions": [f"q{d} {i}" for i in range(3)],
             "outputs": ["a " * (4 + i) for i in range(3)]} for d in range(6)]
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_shuffled_is_the_same_requests_spread_out(leval_file, word_tokenizer):
    records = load_leval(leval_file)
    grouped = sample_leval(records, word_tokenizer, None, 0, LIMITS)
    shuffled = sample_leval(records, word_tokenizer, None, 0, LIMITS, order=LEvalOrder.SHUFFLED)
    assert len(grouped) == 18 and sorted(grouped, key=hash) == sorted(shuffled, key=hash)
    docs = [r.prompt_len for r in grouped]
    assert all(docs[i] // 10 == docs[i + 1] // 10 for i in range(0, 18, 3))  # papers in a row
    assert shuffled != grouped
    assert sample_leval(records, word_tokenizer, 5, 0, LIMITS, order=LEvalOrder.SHUFFLED) == shuffled[:5]
    with pytest.raises(ValueError, match="only 18"):
        sample_leval(records, word_tokenizer, 19, 0, LIMITS, order=LEvalOrder.SHUFFLED)


def test_a_papers_instructions_share_its_whole_document(leval_file, word_tokenizer):
    reqs = sample_leval(load_leval(leval_file), word_tokenizer, None, 0, LIMITS)
    shared = prefix_sharing(reqs, block_size=1).shared_tokens
    header = len(word_tokenizer.encode("Now you are given a very long document. Please follow "
                                       "the instruction after this document.\n\nDocument:\n"))
    # A paper's first instruction reuses the header every paper starts with (none for the
    # very first); its 2nd and 3rd reuse the header and the whole document.
    for p, (first, *rest) in enumerate(reqs[i:i + 3] for i in range(0, 18, 3)):
        assert shared[3 * p] == (header if p else 0)
        doc = first.prompt_len - 4  # header + document: the instruction line is 4 words
        assert all(r.prompt_token_ids[:doc] == first.prompt_token_ids[:doc] for r in rest)
        assert shared[3 * p + 1] >= doc and shared[3 * p + 2] >= doc


def test_paper_assistant_unshared_fraction(word_tokenizer):
    if not PAPER_ASSISTANT.is_file():
        pytest.skip(f"{PAPER_ASSISTANT} absent")
    records = load_leval(PAPER_ASSISTANT)
    reqs = sample_leval(records, word_tokenizer, None, 0, LIMITS)
    assert len(reqs) == sum(len(r.instructions) for r in records)
    s = prefix_sharing(reqs, block_size=16)
    # Three instructions a paper: about two thirds of the prompt tokens are shared.
    assert 0.6 < s.shared_fraction < 0.7
