"""Greedy outputs under the logit bias and vLLM's penalties equal a reference built on HF
transformers' logits (each step's last-position logits in fp32, the penalties applied token
by token, argmax), and HF's own `repetition_penalty`; through chunked prefill, preemption
(recompute and swap), prefix-cache hits and async scheduling, where the sampler must still
see every prompt and output token."""

import pytest
import torch

from kvtier import LLM, SamplingParams
from tests.hf_models import save_tiny_model
from tests.runner.test_penalties import reference

SHARED = list(range(40, 76))  # a prefix two prompts share: the second one hits it
PROMPTS = [[5, 17, 42, 99, 3, 250, 17, 17], SHARED + [7, 7, 9], list(range(10, 60)),
           SHARED + [300, 301, 302, 7, 8, 9]]
NEW_TOKENS = 20
PENALIZED = dict(repetition_penalty=1.3, frequency_penalty=0.7, presence_penalty=0.4,
                 logit_bias={7: 1.5, 300: -2.0})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = save_tiny_model("llama-gqa", tmp_path_factory.mktemp("penalties"))
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model


def hf_reference(model, prompt: list[int], params: SamplingParams) -> list[int]:
    out: list[int] = []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(torch.tensor([prompt + out])).logits[0, -1].float()
            out.append(int(reference(logits, params, prompt, out).argmax()))
    return out


def run_kvtier(path, params: SamplingParams, together: bool = False,
               **options) -> tuple[list[list[int]], int]:
    """Outputs, and the preemptions; the prompts one after another (the later shared
    prompt hits the cached prefix) or all at once."""
    options.setdefault("max_model_len", 80)
    options.setdefault("device", "cpu")
    llm = LLM(str(path), dtype="float32", **options)
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = (llm.generate(prompts, params) if together
            else [o for p in prompts for o in llm.generate([p], params)])
    llm.engine.check_integrity()
    assert llm.engine.scheduler.kv.all_free()
    if not together:
        assert llm.engine.get_stats().num_prefix_cache_hits_total > 0
    return [o.outputs[0].token_ids for o in outs], llm.engine.get_stats().num_preemptions_total


SMALL_POOL = {"num_gpu_blocks": 24, "block_size": 4, "layers_per_block": 4}


@pytest.mark.parametrize("together,options", [
    (False, {}), (False, {"max_num_batched_tokens": 7}), (False, {"async_scheduling": True}),
    (True, {"kv_policy": "recompute", **SMALL_POOL}),
    (True, {"kv_policy": "swap", **SMALL_POOL}),
    (True, {"kv_policy": "recompute", "async_scheduling": True, **SMALL_POOL})])
def test_penalized_greedy_matches_the_hf_reference(tiny, together, options):
    """Together in the small pool the requests are preempted and resumed; under async
    scheduling each row's history must also hold the token its last step left in flight."""
    path, model = tiny
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            **PENALIZED)
    want = [hf_reference(model, p, params) for p in PROMPTS]
    assert want != [hf_reference(model, p, SamplingParams(temperature=0.0)) for p in PROMPTS]
    got, preemptions = run_kvtier(path, params, together, **options)
    assert got == want
    assert preemptions > 0 or "num_gpu_blocks" not in options


def test_repetition_penalty_matches_hf_generate(tiny):
    path, model = tiny
    want = [model.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS,
                           min_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None,
                           pad_token_id=0, repetition_penalty=1.5)[0, len(p):].tolist()
            for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            repetition_penalty=1.5)
    assert run_kvtier(path, params)[0] == want


@pytest.mark.gpu
def test_penalized_greedy_on_the_gpu_matches_the_hf_reference(tiny):
    """The GPU path in fp32 (async scheduling, decode graphs, the penalties' uploads through
    the pinned staging), all four prompts at once in a pool that preempts them."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    path, model = tiny
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True,
                            **PENALIZED)
    got, preemptions = run_kvtier(path, params, True, device="cuda", **SMALL_POOL)
    assert preemptions > 0
    assert got == [hf_reference(model, p, params) for p in PROMPTS]
