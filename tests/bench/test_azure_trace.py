import numpy as np
import pytest

from kvtier.bench.azure_trace import gap_statistics, load_azure_trace
from kvtier.bench.request import LengthLimits

CSV = """TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.0000000,374,44
2023-11-16 18:15:46.5000000,10,3000
2023-11-16 18:15:47.2500000,5000,20
2023-11-16 18:15:48.0000001,200,200
"""


@pytest.fixture
def trace(tmp_path):
    p = tmp_path / "t.csv"
    p.write_text(CSV)
    return load_azure_trace(p)


def test_timestamps_relative_with_sub_microsecond_digits(trace):
    np.testing.assert_allclose(trace.timestamps_s, [0.0, 0.5, 1.25, 2.0000001], atol=1e-9)
    np.testing.assert_allclose(trace.gaps_s(), [0.5, 0.75, 0.7500001], atol=1e-9)
    assert list(trace.context_tokens) == [374, 10, 5000, 200]


def test_window_rebases(trace):
    w = trace.window(1, 2)
    np.testing.assert_allclose(w.timestamps_s, [0.0, 0.75])
    assert list(w.generated_tokens) == [3000, 20]
    with pytest.raises(ValueError):
        trace.window(3, 2)


def test_lengths_clipped_not_dropped(trace):
    lim = LengthLimits(max_prompt_len=1024, max_total_len=2048)
    assert trace.lengths(lim) == [(374, 44), (10, 2038), (1024, 20), (200, 200)]


def test_gap_statistics(trace):
    mean, cv = gap_statistics(trace)
    gaps = np.array([0.5, 0.75, 0.7500001])
    assert mean == pytest.approx(gaps.mean())
    assert cv == pytest.approx(gaps.std() / gaps.mean())


def test_unsorted_rows_sorted(tmp_path):
    p = tmp_path / "u.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 00:00:02.0,2,2\n2023-11-16 00:00:01.0,1,1\n")
    t = load_azure_trace(p)
    assert list(t.context_tokens) == [1, 2] and list(t.timestamps_s) == [0.0, 1.0]


def test_missing_columns(tmp_path):
    p = tmp_path / "m.csv"
    p.write_text("TIMESTAMP,ContextTokens\n2023-11-16 00:00:01.0,1\n")
    with pytest.raises(ValueError, match="GeneratedTokens"):
        load_azure_trace(p)


def test_shared_conversation_trace(shared_data):
    t = load_azure_trace(shared_data / "azure_llm_trace_conv_2023.csv")
    assert len(t) == 19366
    mean, cv = gap_statistics(t)
    assert 1 / mean == pytest.approx(5.4, rel=0.05)  # the data README's ~5.4 req/s
    assert cv > 1  # burstier than Poisson
    assert t.context_tokens.mean() == pytest.approx(1155, rel=0.01)
    assert t.generated_tokens.mean() == pytest.approx(211, rel=0.01)


def test_the_2024_traces_utc_offsets_and_stamps_without_a_fraction(tmp_path):
    p = tmp_path / "t24.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2024-05-10 00:00:00.009930+00:00,100,10\n"
                 "2024-05-10 00:00:01+00:00,200,20\n"
                 "2024-05-10 02:00:02.5+02:00,300,30\n")  # 00:00:02.5 UTC
    trace = load_azure_trace(p)
    assert trace.timestamps_s.tolist() == pytest.approx([0.0, 0.99007, 2.49007])
    assert trace.context_tokens.tolist() == [100, 200, 300]


def test_a_bad_row_is_named_by_its_line(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.6805900,374,44\n"
                 "yesterday,396,109\n")
    with pytest.raises(ValueError, match=r"bad.csv:3: timestamp 'yesterday'"):
        load_azure_trace(p)
    p.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,many,44\n")
    with pytest.raises(ValueError, match=r"bad.csv:2: invalid literal"):
        load_azure_trace(p)


BURST = """Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type
5,ChatGPT,472,18,490,Conversation log
45,ChatGPT,1087,0,1087,Conversation log
30,GPT-4,417,276,693,Conversation log
118,GPT-4,0,0,0,API log
200,ChatGPT,90,12,102,API log
"""


def test_burstgpt_failures_left_out_and_rows_in_time_order(tmp_path):
    from kvtier.bench.azure_trace import load_burstgpt_trace, load_trace_csv

    p = tmp_path / "BurstGPT_1.csv"
    p.write_text(BURST)
    trace = load_burstgpt_trace(p)
    np.testing.assert_allclose(trace.timestamps_s, [0, 25, 195])
    assert trace.context_tokens.tolist() == [472, 417, 90]
    assert trace.generated_tokens.tolist() == [18, 276, 12]
    assert load_trace_csv(p).context_tokens.tolist() == [472, 417, 90]  # told by its header
    q = tmp_path / "azure.csv"
    q.write_text(CSV)
    assert len(load_trace_csv(q)) == 4


def test_burstgpt_v2_columns_and_a_bad_row(tmp_path):
    from kvtier.bench.azure_trace import load_burstgpt_trace

    p = tmp_path / "v2.csv"
    p.write_text("Timestamp,Session ID,Elapsed time,Model,Request tokens,Response tokens,"
                 "Total tokens,Log Type\n1.5,s1,2.0,ChatGPT,10,5,15,Conversation log\n"
                 "3.0,s1,1.0,ChatGPT,20,6,26,Conversation log\n")
    assert load_burstgpt_trace(p).gaps_s().tolist() == [1.5]
    p.write_text("Timestamp,Model,Request tokens,Response tokens\n1,ChatGPT,ten,5\n")
    with pytest.raises(ValueError, match=r"v2.csv:2"):
        load_burstgpt_trace(p)
