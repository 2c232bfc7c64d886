import json

import pytest

from kvtier.bench.leval import load_leval, sample_leval
from kvtier.bench.request import LengthLimits


def _write(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")


@pytest.fixture
def leval_file(tmp_path):
    p = tmp_path / "le.jsonl"
    _write(p, [
        {"input": "doc one " * 50, "instructions": ["q a", "q b c"], "outputs": ["x " * 5, "y " * 7],
         "source": "s", "evaluation": "e"},
        {"input": "doc two " * 30, "instructions": ["q d"], "outputs": ["z " * 9]},
    ])
    return p


def test_one_request_per_instruction_with_shared_document(leval_file, word_tokenizer):
    records = load_leval(leval_file)
    assert [len(r.instructions) for r in records] == [2, 1]
    reqs = sample_leval(records, word_tokenizer, None, seed=0)
    assert sorted(r.output_len for r in reqs) == [5, 7, 9]
    by_out = {r.output_len: r for r in reqs}
    a, b = by_out[5], by_out[7]
    header = len(word_tokenizer.encode("Now you are given a very long document. Please follow "
                                       "the instruction after this document.\n\nDocument:\n"))
    doc = header + 100  # "doc one " * 50 is 100 words
    assert a.prompt_token_ids[:doc] == b.prompt_token_ids[:doc]  # the shared prefix
    assert a.prompt_token_ids[doc:] != b.prompt_token_ids[doc:]
    assert a.prompt_len == doc + len(word_tokenizer.encode("\n\nInstruction: q a\nAnswer:"))
    # Instructions of one document stay next to each other in the workload.
    order = [r.output_len for r in reqs]
    assert abs(order.index(5) - order.index(7)) == 1


def test_document_cap_and_limits(leval_file, word_tokenizer):
    records = load_leval(leval_file)
    reqs = sample_leval(records, word_tokenizer, None, seed=0, max_document_tokens=20)
    assert all(r.prompt_len == 20 + 4 or r.prompt_len == 20 + 5 for r in reqs)
    lim = LengthLimits(max_prompt_len=80, max_total_len=None)
    assert [r.output_len for r in sample_leval(records, word_tokenizer, None, 0, lim)] == [9]
    with pytest.raises(ValueError, match="only 1"):
        sample_leval(records, word_tokenizer, 2, 0, lim)


def test_seed_shuffles_documents(leval_file, word_tokenizer):
    records = load_leval(leval_file)
    orders = {tuple(r.output_len for r in sample_leval(records, word_tokenizer, None, s)) for s in range(20)}
    assert orders == {(5, 7, 9), (9, 5, 7)}


def test_mismatched_outputs_rejected(tmp_path):
    p = tmp_path / "bad.jsonl"
    _write(p, [{"input": "d", "instructions": ["a", "b"], "outputs": ["x"]}])
    with pytest.raises(ValueError, match="2 instructions, 1 outputs"):
        load_leval(p)


def test_shared_paper_assistant(shared_data, word_tokenizer):
    records = load_leval(shared_data / "leval_paper_assistant.jsonl")
    assert len(records) == 23
    reqs = sample_leval(records, word_tokenizer, None, seed=0)
    assert len(reqs) == sum(len(r.instructions) for r in records)
    assert sum(r.prompt_len for r in reqs) / len(reqs) > 2000  # long-context documents


@pytest.mark.parametrize("line, message", [
    ('{"input": "d", "instructions": ["q"]}', r"le.jsonl:2: .*missing \['outputs'\]"),
    ('{"input": "d", "instructions": "q", "outputs": "a"}', r"le.jsonl:2: .*lists of strings"),
    ('{"input": "d", "instructions": ["q", "r"], "outputs": ["a"]}', r"le.jsonl:2: 2 instructions, 1"),
    ('{"input": "d", ', r"le.jsonl:2: not JSON"),
    ('["not", "a", "record"]', r"le.jsonl:2: .*missing"),
])
def test_a_malformed_line_is_named_by_its_number(tmp_path, line, message):
    p = tmp_path / "le.jsonl"
    p.write_text(json.dumps({"input": "d", "instructions": ["q"], "outputs": ["a"]}) + "\n"
                 + line + "\n")
    with pytest.raises(ValueError, match=message):
        load_leval(p)


def test_an_empty_file_is_refused(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("\n\n")
    with pytest.raises(ValueError, match="no L-Eval records"):
        load_leval(p)
