"""Data files other than the ones the loaders were written against: other spellings are
read, bad files get an error that names the file (and the option that gave it), and a
workload never runs fewer requests than asked for without saying so."""

import json

import pytest

from kvtier.bench.cli import add_bench_parser, run_bench
from kvtier.bench.data_file import DataFileError
from kvtier.bench.leval import load_leval, sample_leval
from kvtier.bench.prepared import load_prepared
from kvtier.bench.request import BenchRequest, LengthLimits
from kvtier.bench.sharegpt import load_sharegpt_pairs, load_sharegpt_records, sample_sharegpt

OPEN = LengthLimits(min_prompt_len=1, min_output_len=1, max_prompt_len=None, max_total_len=None)


def _conv(human, gpt):
    return {"conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}]}


def _leval_row(doc="d e f g", instructions=("q r",), outputs=("a b c d",)):
    return {"input": doc, "instructions": list(instructions), "outputs": list(outputs),
            "source": "quality", "evaluation": "exam"}


def _bench(*argv):
    import argparse

    parser = argparse.ArgumentParser()
    add_bench_parser(parser.add_subparsers())
    args = parser.parse_args(["bench", "--model", "tiny-llama", "--load-format", "dummy",
                              "--prepare-only", "--no-gpu-monitor", *argv])
    return run_bench(args)


# --- files that cannot be read: one error, naming the file ---

def _made(path, kind):
    """A file at `path` with the fault `kind`."""
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text(" \n\n")
    elif kind == "latin-1":
        path.write_bytes(json.dumps([_conv("café", "x")], ensure_ascii=False).encode("latin-1"))
    return path


@pytest.mark.parametrize("kind, problem", [
    ("missing", "no such file"), ("directory", "is a directory"), ("empty", "is empty"),
    ("latin-1", r"not UTF-8 text \(byte 0xe9"),
])
@pytest.mark.parametrize("load", [load_sharegpt_pairs, load_leval,
                                  lambda p: load_prepared(p, 1, OPEN)])
def test_an_unreadable_file_is_named_with_its_fault(tmp_path, kind, problem, load):
    path = _made(tmp_path / "data.json", kind)
    with pytest.raises(DataFileError, match=rf"data.json: {problem}"):
        load(path)


def test_bench_names_the_option_of_a_bad_file(tmp_path):
    with pytest.raises(SystemExit, match=r"--dataset-path \S*nope.json: no such file"):
        _bench("--workload", "sharegpt", "--dataset-path", str(tmp_path / "nope.json"))
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([_conv("a b c d", "e f g h")] * 3))
    # --arrivals trace reads its file while the options are read: no traceback either.
    with pytest.raises(SystemExit, match=r"--trace-path \S*nope.csv: no such file"):
        _bench("--dataset-path", str(sharegpt), "--num-prompts", "2", "--arrivals", "trace",
               "--trace-path", str(tmp_path / "nope.csv"))
    with pytest.raises(SystemExit, match=r"--dataset-path / --trace-path \S*sg.json:1: not a "
                                         "Mooncake trace row"):  # one file given to both
        _bench("--dataset-path", str(sharegpt), "--arrivals", "trace", "--trace-path",
               str(sharegpt))
    with pytest.raises(SystemExit, match=r"--dataset-path \S*nope.json: no such file"):
        _bench("--workload", "prepared", "--dataset-path", str(tmp_path / "nope.json"),
               "--arrivals", "paper-gamma")


def test_a_relative_path_names_its_option_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"--dataset-path \S*nope.json: no such file"):
        _bench("--workload", "sharegpt", "--dataset-path", "./nope.json")


@pytest.mark.parametrize("num", ["0", "-1"])
def test_num_prompts_below_one_is_refused(tmp_path, num):
    sharegpt = tmp_path / "sg.json"
    sharegpt.write_text(json.dumps([_conv("a b c d", "e f g h")] * 3))
    with pytest.raises(SystemExit, match=f"--num-prompts must be >= 1, got {num}"):
        _bench("--dataset-path", str(sharegpt), "--num-prompts", num)


def test_a_byte_order_mark_is_not_a_fault(tmp_path):
    from kvtier.bench.azure_trace import load_azure_trace

    sharegpt, leval, trace = tmp_path / "sg.json", tmp_path / "le.jsonl", tmp_path / "t.csv"
    sharegpt.write_text("\ufeff" + json.dumps([_conv("h", "g")]), encoding="utf-8")
    leval.write_text("\ufeff" + json.dumps(_leval_row()) + "\n", encoding="utf-8")
    trace.write_text("\ufeffTIMESTAMP,ContextTokens,GeneratedTokens\n"
                     "2023-11-16 00:00:00.0,5,6\n", encoding="utf-8")
    assert load_sharegpt_pairs(sharegpt) == [("h", "g")]
    assert load_leval(leval)[0].document == "d e f g"
    assert load_azure_trace(trace).context_tokens.tolist() == [5]


# --- ShareGPT: other shapes of a valid file ---

def test_sharegpt_in_a_wrapping_object_or_one_pretty_record(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text(json.dumps({"version": 2, "data": [_conv("h1", "g1"), _conv("h2", "g2")]},
                            indent=2))
    assert load_sharegpt_pairs(p) == [("h1", "g1"), ("h2", "g2")]
    p.write_text(json.dumps(_conv("h", "g"), indent=2))  # one record over several lines
    assert load_sharegpt_pairs(p) == [("h", "g")]
    p.write_text(json.dumps({"a": [1], "b": [2]}))
    with pytest.raises(DataFileError, match=r"keys \['a', 'b'\]: not a conversation record"):
        load_sharegpt_pairs(p)


def test_openai_text_parts_are_the_turns_text(tmp_path):
    p = tmp_path / "sg.jsonl"
    parts = [{"type": "text", "text": "look"}, {"type": "text", "text": "here"}]
    image = [{"type": "text", "text": "what is"}, {"type": "image_url", "image_url": {"url": "x"}}]
    p.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": c},
                                                    {"role": "assistant", "content": "ok"}]})
                           for c in (parts, image)))
    assert load_sharegpt_pairs(p) == [("look\nhere", "ok")]  # the image turn is skipped


def test_an_empty_sharegpt_array_says_so(tmp_path):
    p = tmp_path / "sg.json"
    p.write_text("[]")
    with pytest.raises(DataFileError, match="holds no conversation records"):
        load_sharegpt_records(p)


def test_a_fault_inside_a_sharegpt_array_is_an_error_not_a_cut(tmp_path, caplog):
    p = tmp_path / "sg.json"
    good = json.dumps(_conv("h", "g"), indent=1)
    p.write_text(f"[\n{good},\n{{\"conversations\": oops}},\n{good}\n]")
    with pytest.raises(DataFileError, match=r"sg.json:\d+: not JSON after record 1"):
        load_sharegpt_records(p)
    p.write_text(f"[\n{good},\n{good[:-9]}")  # the file cut off inside its last record
    assert len(load_sharegpt_records(p)) == 1 and "truncated" in caplog.text
    for cut in ('{"conversations": [], "x": tru', '{"conversations": [], "x": nul',
                '{"conversations": [{"from": "human", "value": "caf\\u00'):
        p.write_text(f"[\n{good},\n{cut}")  # cut inside a literal or an escape
        assert len(load_sharegpt_records(p)) == 1


# --- L-Eval: other tasks, other layouts ---

def test_leval_records_as_one_json_array(tmp_path, word_tokenizer):
    p = tmp_path / "tpo.json"
    p.write_text(json.dumps([_leval_row(), _leval_row("x y z", ("q1", "q2"), ("A", "B"))],
                            indent=2))
    records = load_leval(p)
    assert [r.instructions for r in records] == [("q r",), ("q1", "q2")]
    p.write_text(json.dumps([_leval_row(), {"input": "no instructions", "outputs": []}]))
    with pytest.raises(DataFileError, match=r"tpo.json: record 1: .*missing \['instructions'\]"):
        load_leval(p)


def test_too_few_leval_requests_says_which_bound_dropped_them(tmp_path, word_tokenizer):
    """A multiple-choice task's answers are one token long: vLLM's minimum of 4 output
    tokens drops them all, and the error names that option, not the context length."""
    p = tmp_path / "quality.jsonl"
    p.write_text("\n".join(json.dumps(_leval_row(outputs=("(A)",))) for _ in range(3)))
    records = load_leval(p)
    with pytest.raises(ValueError, match=r"3 with output < 4 tokens \(--min-output-len\)"):
        sample_leval(records, word_tokenizer, 2, 0, LengthLimits(max_prompt_len=None))
    assert len(sample_leval(records, word_tokenizer, 2, 0, OPEN)) == 2


def test_too_few_sharegpt_requests_says_which_bound_dropped_them(word_tokenizer):
    pairs = [("w " * 50, "w " * 10)] * 3 + [("a b c d", "e f g h")]
    with pytest.raises(ValueError, match=r"only 1 of 4 .*3 with prompt > 20 tokens "
                                         r"\(--max-prompt-len, --max-model-len\).*asked for 2 \(--num-prompts\)"):
        sample_sharegpt(pairs, word_tokenizer, 2, 0, LengthLimits(max_prompt_len=20))


# --- lengths: an empty reply or prompt is dropped, never a crash ---

def test_zero_minimums_drop_empty_prompts_and_replies(word_tokenizer):
    zero = LengthLimits(min_prompt_len=0, min_output_len=0, max_prompt_len=None,
                        max_total_len=None)
    pairs = [("a b", ""), ("", "c d"), ("e f", "g")]
    assert [(r.prompt_len, r.output_len) for r in
            sample_sharegpt(pairs, word_tokenizer, 1, 0, zero)] == [(2, 1)]
    assert zero.clip(0, 0) == (1, 1)  # a trace row of zeros still makes a request
    BenchRequest((1,), zero.clip(0, 0)[1])


# --- prepared files: a malformed one is named, not a KeyError ---

@pytest.mark.parametrize("doc, message", [
    ([], "not a prepared workload"),
    ({"spec": {}}, "not a prepared workload"),
    ({"requests": [[1, 2]]}, r"request 0 is \[1, 2\], not \[\[prompt token ids\], output_len\]"),
    ({"requests": [[[1, 2, 3, 4], 5]], "follows": [3], "think_s": [0]},
     "request 0 follows 3: not an earlier request"),
    ({"requests": [[[1, 2, 3, 4], 5.5]]}, "request 0 is"),
])
def test_a_malformed_prepared_file_is_named(tmp_path, doc, message):
    p = tmp_path / "w.json"
    p.write_text(json.dumps(doc))
    with pytest.raises(DataFileError, match=message):
        load_prepared(p, 1, OPEN)


def test_a_short_trace_names_the_options(tmp_path, word_tokenizer):
    from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
    from kvtier.bench.workload import Dataset, WorkloadSpec, build_workload

    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 00:00:00.0,5,6\n")
    spec = WorkloadSpec(Dataset.AZURE, 3, ArrivalSpec(ArrivalKind.OFFLINE), path=str(p))
    with pytest.raises(ValueError, match=r"has 1 requests; asked for 3 \(--num-prompts\)"):
        build_workload(spec, word_tokenizer, 1000)


def test_a_prepared_output_length_written_as_a_whole_float_is_read(tmp_path):
    """As before the checks came in (int(output_len))."""
    p = tmp_path / "w.json"
    p.write_text(json.dumps({"requests": [[[1, 2, 3, 4], 5.0]]}))
    requests = load_prepared(p, 1, OPEN)
    assert requests[0].output_len == 5 and isinstance(requests[0].output_len, int)
