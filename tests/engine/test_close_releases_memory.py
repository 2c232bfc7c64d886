"""LLMEngine.close() frees the KV pools itself: nothing the runner keeps after a step (swap
copies, attention views, hidden states) may still hold them, so a benchmark building one
engine after another does not wait for the garbage collector or for `del engine`."""

from __future__ import annotations

import gc
import weakref

import pytest

from kvtier import SamplingParams
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("policy", ["recompute", "swap", "ellm", "hcache"])
def test_close_releases_pools(policy, async_scheduling):
    eng = LLMEngine.from_engine_args(EngineArgs(
        model="tiny-llama", load_format="dummy", kv_policy=policy, enforce_eager=True,
        max_model_len=64, num_gpu_blocks=40, num_host_blocks=8,
        async_scheduling=async_scheduling))
    runner = eng.executor
    params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
    for i in range(3):
        eng.add_request(str(i), list(range(1, 4 + 5 * i)), params)
    for _ in range(3):  # steps leave their metadata, views and copies behind
        eng.step()
    pools = [runner.gpu_kv]
    if runner.host_kv is not None and runner.host_kv.numel():
        pools.append(runner.host_kv)
    refs = [weakref.ref(t) for t in pools]
    del pools
    eng.close()
    gc.collect()
    assert [r() is None for r in refs] == [True] * len(refs)
    assert eng.executor is runner  # the engine itself is still alive
