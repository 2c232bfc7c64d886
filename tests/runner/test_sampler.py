"""The sampler takes logits in the model's dtype: greedy picks from them as they are, every
other path samples from their fp32 cast, so bf16 logits give exactly what their fp32 copy
gives."""

import numpy as np
import pytest
import torch

from kvtier.runner.sampler import SampleRow, sample
from kvtier.sampling_params import SamplingParams


def _logits(rows: int, vocab: int = 300, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, vocab, generator=g).to(torch.bfloat16)
    x[0, 7] = x[0, 11] = x[0].max() + 1  # a tie: the first index wins in either dtype
    return x


def _rows(params: SamplingParams, n: int, banned: tuple[int, ...] = ()) -> list[SampleRow]:
    return [SampleRow(params, 3, banned) for _ in range(n)]


def test_greedy_on_bf16_equals_its_fp32_cast():
    logits = _logits(16)
    greedy = _rows(SamplingParams(temperature=0.0), 16)
    out = sample(logits, greedy)
    assert out.token_ids == logits.float().argmax(dim=-1).tolist()
    assert out.token_ids[0] == 7


def test_other_paths_sample_the_fp32_cast():
    logits = _logits(8, seed=1)
    kept = logits.clone()
    for params, banned in (
        (SamplingParams(temperature=0.0, logprobs=3), ()),
        (SamplingParams(temperature=0.0, logprobs=0), (7, 11)),  # min_tokens' banned ids
        (SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=5, logprobs=2), ()),
    ):
        got = sample(logits, _rows(params, 8, banned))
        want = sample(logits.float(), _rows(params, 8, banned))
        assert got.token_ids == want.token_ids
        assert got.logprobs == want.logprobs
        assert all(lp is not None and set(lp) >= {t} for lp, t in zip(got.logprobs,
                                                                       got.token_ids))
        assert not set(banned) & set(got.token_ids)
    assert torch.equal(logits, kept)  # the banned ids went into the fp32 copy


def test_min_p_never_draws_a_token_below_its_share_of_the_likeliest():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(400, 1)
    params = SamplingParams(temperature=1.0, min_p=0.4)  # keeps p >= 0.2: tokens 0 and 1
    drawn = set(sample(logits, _rows(params, 400)).token_ids)
    assert drawn == {0, 1}
    everything = set(sample(logits, _rows(SamplingParams(temperature=1.0), 400)).token_ids)
    assert everything == {0, 1, 2, 3}


def test_min_p_outside_zero_to_one_is_refused():
    from kvtier.sampling_params import InvalidRequestError

    with pytest.raises(InvalidRequestError, match="min_p"):
        SamplingParams(min_p=1.5)


def _mixed_rows() -> list[SampleRow]:
    """Greedy, seeded, filtered and banned rows in one batch (the seeded ones draw the
    same whatever else is in it)."""
    kinds = [
        (SamplingParams(temperature=0.0), ()),
        (SamplingParams(temperature=0.7, top_k=12, seed=3), ()),
        (SamplingParams(temperature=1.3, top_p=0.8, seed=4), (5, 9)),
        (SamplingParams(temperature=0.0), (7,)),
        (SamplingParams(temperature=0.9, min_p=0.05, seed=6), ()),
    ]
    return [SampleRow(p, 2, banned) for p, banned in kinds]


def test_sampling_on_the_device_draws_what_the_host_path_draws():
    from kvtier.runner.sampler import sample_on_device

    logits = _logits(5, seed=2)
    uploads = []

    def upload(a):
        uploads.append(a.copy())
        return torch.from_numpy(a)

    rows = _mixed_rows()
    on_device = sample_on_device(logits, rows, upload)
    assert on_device.dtype == torch.int64
    assert on_device.tolist() == sample(logits, rows).token_ids
    assert {7, 5, 9}.isdisjoint({on_device[3].item(), on_device[2].item()})
    # the banned ids' rows and columns, the sampled rows' indices, their temperatures
    assert [u.tolist() for u in uploads[:2]] == [[2, 2, 3], [5, 9, 7]]
    assert uploads[2].tolist() == [1, 2, 4]
    assert uploads[3].dtype == np.float32 and uploads[3].tolist() == pytest.approx(
        [0.7, 1.3, 0.9])


def test_a_whole_sampled_batch_uploads_its_temperatures_alone():
    from kvtier.runner.sampler import sample_on_device

    rows = _rows(SamplingParams(temperature=0.5, seed=1), 4)
    uploads = []
    sample_on_device(_logits(4), rows, lambda a: uploads.append(a) or torch.from_numpy(a))
    assert [u.tolist() for u in uploads] == [[0.5] * 4]


@pytest.mark.gpu
def test_on_the_gpu_sampling_makes_no_pageable_copy():
    from torch.profiler import ProfilerActivity, profile

    from kvtier.runner.sampler import sample_on_device
    from kvtier.runner.staging import PinnedStaging

    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    logits = _logits(5, seed=2).cuda()
    staging = PinnedStaging(torch.device("cuda"))
    rows = _mixed_rows()
    want = sample(logits.cpu().cuda(), rows).token_ids
    staging.next_step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        got = sample_on_device(logits, rows, staging.put)
        torch.cuda.synchronize()
    assert got.tolist() == want
    names = [e.name for e in prof.events()]
    assert not [n for n in names if "Pageable" in n], names
