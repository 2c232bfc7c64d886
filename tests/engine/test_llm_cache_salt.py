"""vLLM's `cache_salt` in the offline LLM: in a prompt dict, as vLLM takes it, or in
SamplingParams; only prompts under the same salt share cached blocks."""

from __future__ import annotations

from kvtier.entrypoints.llm import LLM
from kvtier.sampling_params import SamplingParams

OPTS = dict(load_format="dummy", device="cpu", dtype="float32", max_model_len=128,
            num_gpu_blocks=64, block_size=16)


def test_only_the_same_salt_hits():
    llm = LLM("tiny-llama", **OPTS)
    ids = list(range(200, 250))
    params = SamplingParams(max_tokens=2, temperature=0.0)

    def cached(prompt, p=params) -> int:
        return llm.generate(prompt, p)[0].num_cached_tokens

    assert cached({"prompt_token_ids": ids, "cache_salt": "a"}) == 0
    assert cached({"prompt_token_ids": ids, "cache_salt": "a"}) == 48
    assert cached({"prompt_token_ids": ids, "cache_salt": "b"}) == 0
    assert cached(ids) == 0
    assert cached(ids, SamplingParams(max_tokens=2, temperature=0.0, cache_salt="b")) == 48
