"""Mooncake's traces: requests share exactly the prefixes their hash ids say, lengths are
clipped keeping the shared blocks, and the timestamps give the gaps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.cli import arrival_spec
from kvtier.bench.mooncake_trace import load_mooncake_trace, mooncake_requests, trace_gaps_s
from kvtier.bench.request import LengthLimits
from kvtier.bench.sharing import prefix_sharing
from kvtier.bench.workload import Dataset, WorkloadSpec, build_workload
from tests.bench.test_cli import parse

B = 4  # tokens a hash id stands for, small for the test
ROWS = [  # out of order: the loader sorts by time
    {"timestamp": 3000, "input_length": 10, "output_length": 3, "hash_ids": [1, 2, 9]},
    {"timestamp": 0, "input_length": 12, "output_length": 5, "hash_ids": [1, 2, 3]},
    {"timestamp": 1500, "input_length": 7, "output_length": 2, "hash_ids": [1, 4]},
    {"timestamp": 4000, "input_length": 6, "output_length": 0, "hash_ids": [5]},  # short of blocks
]


@pytest.fixture
def path(tmp_path):
    p = tmp_path / "trace.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in ROWS) + "\n")
    return p


def test_load_sorts_and_rebases(path):
    trace = load_mooncake_trace(path)
    assert [r.timestamp_s for r in trace] == [0.0, 1.5, 3.0, 4.0]
    np.testing.assert_allclose(trace_gaps_s(trace), [1.5, 1.5, 1.0])
    assert trace[0].hash_ids == (1, 2, 3)


def test_prefixes_shared_as_the_hash_ids_say(path):
    reqs, report = mooncake_requests(load_mooncake_trace(path), LengthLimits(1, 1, None, None),
                                     vocab_size=1000, seed=0, block_size=B)
    a, b, c, d = (r.prompt_token_ids for r in reqs)
    assert [len(x) for x in (a, b, c, d)] == [12, 7, 10, 6]
    assert a[:8] == c[:8] and a[8:12] != c[8:12]  # blocks 1, 2 shared; 3 against 9
    assert a[:4] == b[:4] and a[4:7] != b[4:7]  # block 1 shared; 2 against 4
    assert d[:4] != a[:4] and len(set(d)) > 1  # block 5, then tokens of its own
    assert [r.output_len for r in reqs] == [5, 2, 3, 1]  # output 0 raised to the minimum
    assert report.num_outside == 1
    sharing = prefix_sharing(reqs, block_size=B)
    assert sharing.shared_tokens == (0, 4, 8, 0)


def test_clipped_prompts_keep_their_leading_blocks(path):
    limits = LengthLimits(1, 1, 9, None)
    reqs, report = mooncake_requests(load_mooncake_trace(path), limits, 1000, 0, B)
    full, _ = mooncake_requests(load_mooncake_trace(path), LengthLimits(1, 1, None, None),
                                1000, 0, B)
    assert [len(r.prompt_token_ids) for r in reqs] == [9, 7, 9, 6]
    assert all(r.prompt_token_ids == f.prompt_token_ids[:len(r.prompt_token_ids)]
               for r, f in zip(reqs, full))
    assert report.num_outside == 3


def test_workload_and_trace_arrivals(path, word_tokenizer):
    args = parse("--workload", "mooncake", "--dataset-path", str(path), "--arrivals", "trace",
                 "--trace-start", "1")
    arrivals = arrival_spec(args)
    assert arrivals.kind is ArrivalKind.TRACE and arrivals.trace_gaps_s == (1.5, 1.0)
    spec = WorkloadSpec(Dataset.MOONCAKE, 3, arrivals, path=str(path), trace_start=1,
                        mooncake_block_size=B)
    w = build_workload(spec, word_tokenizer, 1000)
    np.testing.assert_allclose([r.arrival_s for r in w.requests], [0.0, 1.5, 2.5])
    assert [r.prompt_len for r in w.requests] == [7, 10, 6]
    with pytest.raises(ValueError, match="3 requests from 1 on; asked for 4"):
        build_workload(WorkloadSpec(Dataset.MOONCAKE, 4, ArrivalSpec(ArrivalKind.OFFLINE),
                                    path=str(path), trace_start=1), word_tokenizer, 1000)


def test_a_bad_row_is_named_by_its_line(tmp_path):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps(ROWS[0]) + "\n" + '{"timestamp": 1, "input_length": 3}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_mooncake_trace(p)
