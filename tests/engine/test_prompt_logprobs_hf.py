"""Prompt logprobs (vLLM's `SamplingParams(prompt_logprobs=k)`) equal HF transformers' fp32
log-softmax of the logits at the position before each prompt token, with the k likeliest
tokens there; through chunked prefill, preemption, async scheduling and n > 1, and never
from the prefix cache (a cached token has no logits)."""

import pytest
import torch

from kvtier import LLM, SamplingParams
from tests.hf_models import save_tiny_model

SHARED = list(range(40, 76))
PROMPTS = [[5, 17, 42, 99, 3, 250, 17, 17], SHARED + [7, 7, 9], list(range(10, 60)),
           SHARED + [300, 301, 302, 7, 8, 9]]
K = 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model("qwen3", tmp_path_factory.mktemp("prompt-logprobs"))
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        want = []
        for p in PROMPTS:
            lp = torch.log_softmax(model(torch.tensor([p])).logits[0].float(), dim=-1)
            want.append([None] + [(float(lp[i - 1, p[i]]), lp[i - 1].topk(K).indices.tolist())
                                  for i in range(1, len(p))])
    return path, want


def check(got, want) -> None:
    assert got[0] is None and len(got) == len(want)
    for entry, (lp, top) in zip(got[1:], want[1:]):
        tokens = list(entry)
        assert entry[tokens[0]] == pytest.approx(lp, abs=1e-4)  # the prompt token first
        assert set(top) <= set(tokens) and len(tokens) <= K + 1


@pytest.mark.parametrize("together,options", [
    (False, {}), (False, {"max_num_batched_tokens": 7}), (False, {"async_scheduling": True}),
    (True, {"num_gpu_blocks": 24, "block_size": 4, "layers_per_block": 4}),
    (True, {"num_gpu_blocks": 24, "block_size": 4, "layers_per_block": 4,
            "max_num_batched_tokens": 9, "async_scheduling": True})])
def test_prompt_logprobs_match_hf(tiny, together, options):
    path, want = tiny
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=80, **options)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=K)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = (llm.generate(prompts, params) if together
            else [o for p in prompts for o in llm.generate([p], params)])
    for out, w in zip(outs, want):
        check(out.prompt_logprobs, w)
        assert out.num_cached_tokens == 0  # the shared prefix was not served from the cache
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    if together:
        assert llm.engine.get_stats().num_preemptions_total > 0


def test_n_sequences_share_one_scoring_and_plain_requests_still_hit(tiny):
    path, want = tiny
    llm = LLM(str(path), dtype="float32", device="cpu", max_model_len=80)
    out = llm.generate([{"prompt_token_ids": PROMPTS[1]}],
                       SamplingParams(n=2, temperature=0.0, max_tokens=4, prompt_logprobs=0))[0]
    assert len(out.outputs) == 2
    assert all(len(e) == 1 for e in out.prompt_logprobs[1:])  # k = 0: the token's own
    check([None] + [{**e} for e in out.prompt_logprobs[1:]], [None] + [
        (lp, []) for lp, _ in want[1][1:]])
    plain = llm.generate([{"prompt_token_ids": PROMPTS[3]}], SamplingParams(max_tokens=2))[0]
    assert plain.prompt_logprobs is None and plain.num_cached_tokens > 0


def test_prompt_logprobs_out_of_range_are_refused():
    """Negative or fractional counts by SamplingParams; more than max_logprobs by the
    engine (tests/server/test_max_logprobs.py)."""
    from kvtier.sampling_params import InvalidRequestError

    for k in (-1, 1.5):
        with pytest.raises(InvalidRequestError, match="prompt_logprobs"):
            SamplingParams(prompt_logprobs=k)


@pytest.mark.gpu
def test_prompt_logprobs_on_the_gpu_match_hf(tiny):
    """The GPU path in fp32: the piecewise forward keeps the prompt rows past the last
    layer beside the sampling rows; chunked and preempted."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    path, want = tiny
    llm = LLM(str(path), dtype="float32", device="cuda", max_model_len=80, num_gpu_blocks=24,
              block_size=4, layers_per_block=4, max_num_batched_tokens=9)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, prompt_logprobs=K)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for out, w in zip(outs, want):
        check(out.prompt_logprobs, w)
    assert llm.engine.get_stats().num_preemptions_total > 0


def test_a_request_aborted_mid_prompt_leaves_nothing_behind(tiny):
    """Aborted between two of its prompt's chunks (their scores of the step in flight then
    have nobody to go to): the engine goes on, every block comes back."""
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine

    path, want = tiny
    for async_scheduling in (False, True):
        eng = LLMEngine.from_engine_args(EngineArgs(
            model=str(path), dtype="float32", device="cpu", max_model_len=80,
            max_num_batched_tokens=8, async_scheduling=async_scheduling))
        params = SamplingParams(temperature=0.0, max_tokens=4, prompt_logprobs=K)
        eng.add_request("gone", PROMPTS[2], params)
        eng.add_request("kept", PROMPTS[0], params)
        eng.step()
        eng.abort_request("gone")
        outs = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                outs[out.request_id] = out
            eng.check_integrity()
        assert "gone" not in outs or outs["gone"].finished
        check(outs["kept"].prompt_logprobs, want[0])
        assert eng.scheduler.kv.all_free()
        eng.close()
