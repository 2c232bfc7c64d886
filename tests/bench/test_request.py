import pytest

from kvtier.bench.request import BenchRequest, LengthLimits


def test_limits_are_vllm_sharegpt_filter():
    lim = LengthLimits()
    assert lim.accepts(4, 4)
    assert not lim.accepts(3, 100)  # prompt too short
    assert not lim.accepts(100, 3)  # output too short
    assert lim.accepts(1024, 1024)
    assert not lim.accepts(1025, 10)  # prompt over 1024
    assert not lim.accepts(1000, 1049)  # total over 2048


def test_limits_without_maxima():
    lim = LengthLimits(max_prompt_len=None, max_total_len=None)
    assert lim.accepts(100_000, 50_000)


def test_clip_keeps_inside_limits():
    lim = LengthLimits(min_prompt_len=4, min_output_len=4, max_prompt_len=100, max_total_len=150)
    assert lim.clip(2, 1) == (4, 4)
    assert lim.clip(500, 500) == (100, 50)
    assert lim.clip(90, 10) == (90, 10)
    tight = LengthLimits(max_prompt_len=None, max_total_len=64)
    assert tight.clip(1000, 1000) == (60, 4)


def test_request_validation():
    r = BenchRequest([1, 2, 3], 5, 0.5)
    assert r.prompt_token_ids == (1, 2, 3) and r.prompt_len == 3
    with pytest.raises(ValueError):
        BenchRequest((), 5)
    with pytest.raises(ValueError):
        BenchRequest((1,), 0)
    with pytest.raises(ValueError):
        BenchRequest((1,), 1, -1.0)
