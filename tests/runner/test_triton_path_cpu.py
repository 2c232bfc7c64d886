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


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs the interpreter")
@pytest.mark.parametrize("policy,extra", [
    ("ellm", dict(ellm_uncached_ratio=0.5)),  # prefix rows: the prefill kernel over scratch
    ("hcache", dict(num_gpu_blocks=16, max_model_len=32)),  # re-projected KV, Triton reads it
])
def test_policies_through_the_triton_kernels(policy, extra):
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    prompts = ["a prompt that spans a few blocks of four tokens each", "short", "x y z w"]
    opts = dict(load_format="dummy", max_model_len=64, block_size=4, layers_per_block=2,
                max_num_batched_tokens=32)
    opts.setdefault("num_gpu_blocks", 60)
    opts.update(extra)
    ref = LLM("tiny-llama-gqa", attention_backend="torch", **opts).generate(prompts, params)
    llm = LLM("tiny-llama-gqa", attention_backend="triton", kv_policy=policy, **opts)
    got = llm.generate(prompts, params)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in ref]
    stats = llm.engine.get_stats()
    assert stats.num_prefix_recompute_tokens_total + stats.num_restored_tokens_total > 0
