"""The Triton backend and ops inside the whole engine, on CPU through the interpreter."""

import os

import pytest

from kvtier import LLM, SamplingParams


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
def test_engine_with_triton_backend_equals_torch_backend():
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompts = ["hello there friend, a longer prompt", "x"]
    opts = dict(load_format="dummy", max_model_len=128, num_gpu_blocks=40,
                max_num_batched_tokens=5)  # chunked prefill: decode and prefill rows mixed
    triton = LLM("tiny-llama-gqa", attention_backend="triton", **opts).generate(prompts, params)
    torch = LLM("tiny-llama-gqa", attention_backend="torch", **opts).generate(prompts, params)
    assert [o.outputs[0].token_ids for o in triton] == [o.outputs[0].token_ids for o in torch]
