import numpy as np
import pytest

from kvtier.bench.arrivals import ArrivalKind, ArrivalSpec
from kvtier.bench.azure_trace import load_azure_trace
from kvtier.bench.request import LengthLimits
from kvtier.bench.workload import Dataset, WorkloadSpec, at_rate, build_workload

GAMMA = ArrivalSpec(ArrivalKind.GAMMA, rate=20.0, cv=1.5)


def test_synthetic_reproducible_and_in_vocab(word_tokenizer):
    spec = WorkloadSpec(Dataset.SYNTHETIC, 30, GAMMA, seed=5, input_len=40, output_len=10, range_ratio=0.5)
    w = build_workload(spec, word_tokenizer, vocab_size=100)
    assert w == build_workload(spec, word_tokenizer, vocab_size=100)
    assert len(w.requests) == 30
    assert all(20 <= r.prompt_len <= 60 and 5 <= r.output_len <= 15 for r in w.requests)
    assert all(0 <= t < 100 for r in w.requests for t in r.prompt_token_ids)
    offs = [r.arrival_s for r in w.requests]
    assert offs[0] == 0.0 and offs == sorted(offs) and offs[-1] > 0
    other = build_workload(WorkloadSpec(Dataset.SYNTHETIC, 30, GAMMA, seed=6, input_len=40,
                                        output_len=10, range_ratio=0.5), word_tokenizer, 100)
    assert other.requests != w.requests


def test_at_rate_keeps_requests_changes_gaps(word_tokenizer):
    spec = WorkloadSpec(Dataset.SYNTHETIC, 200, GAMMA, input_len=8, output_len=8)
    w = build_workload(spec, word_tokenizer, 1000)
    fast = at_rate(w, 80.0)
    assert [r.prompt_token_ids for r in fast.requests] == [r.prompt_token_ids for r in w.requests]
    assert fast.spec.arrivals.rate == 80.0
    # Same seed, same gamma draws scaled: offsets are exactly 4x shorter.
    np.testing.assert_allclose([r.arrival_s * 4 for r in fast.requests], [r.arrival_s for r in w.requests])
    summary = w.summary()
    assert summary["num_requests"] == 200 and summary["mean_prompt_len"] == 8.0
    assert summary["offered_rate"] == pytest.approx(20.0, rel=0.25)


def test_azure_replay_lengths_and_times(tmp_path, word_tokenizer):
    p = tmp_path / "t.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 + "".join(f"2023-11-16 00:00:{i:02d}.5,{10 + i},{5 + i}\n" for i in range(20)))
    trace = load_azure_trace(p).window(2, 5)
    arrivals = ArrivalSpec(ArrivalKind.TRACE, trace_gaps_s=tuple(trace.gaps_s()), scale=2.0)
    spec = WorkloadSpec(Dataset.AZURE, 5, arrivals, path=str(p), trace_start=2)
    w = build_workload(spec, word_tokenizer, 1000)
    assert [(r.prompt_len, r.output_len) for r in w.requests] == [(12 + i, 7 + i) for i in range(5)]
    np.testing.assert_allclose([r.arrival_s for r in w.requests], [0, 0.5, 1.0, 1.5, 2.0])
    d = spec.to_dict()
    assert d["dataset"] == "azure" and d["arrivals"]["mean_rate"] == pytest.approx(2.0)
    assert "trace_gaps_s" not in d["arrivals"]


def test_sharegpt_gaps_from_trace(tmp_path, word_tokenizer, monkeypatch):
    import kvtier.bench.workload as wl

    pairs = [(" ".join(["p"] * (5 + i)), " ".join(["o"] * (5 + i))) for i in range(10)]
    monkeypatch.setattr(wl, "load_sharegpt_pairs", lambda path: pairs)
    arrivals = ArrivalSpec(ArrivalKind.TRACE, trace_gaps_s=(0.1, 0.2, 0.3))
    w = build_workload(WorkloadSpec(Dataset.SHAREGPT, 4, arrivals), word_tokenizer, 1000)
    np.testing.assert_allclose([r.arrival_s for r in w.requests], [0, 0.1, 0.3, 0.6])
    assert {r.prompt_len for r in w.requests} <= {5 + i for i in range(10)}


def test_paths_required(word_tokenizer):
    with pytest.raises(ValueError, match="dataset-path"):
        build_workload(WorkloadSpec(Dataset.LEVAL, 2, GAMMA), word_tokenizer, 100)
    with pytest.raises(ValueError, match="dataset-path"):
        build_workload(WorkloadSpec(Dataset.AZURE, 2, GAMMA), word_tokenizer, 100)


def test_default_limits():
    assert WorkloadSpec(Dataset.LEVAL, 1, GAMMA).effective_limits.max_prompt_len is None
    assert WorkloadSpec(Dataset.SHAREGPT, 1, GAMMA).effective_limits == LengthLimits()
