"""The pre-serving warm-up steps leave no trace: greedy outputs after them equal a fresh
engine's, and the runner's block tables hold no warm-up rows."""

from kvtier import SamplingParams
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine


def _tokens(eng: LLMEngine) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    for i, p in enumerate([[5, 6, 7], list(range(40, 90))]):
        eng.add_request(str(i), p, params)
    out = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                out[o.request_id] = o.outputs[0].token_ids
    return [out["0"], out["1"]]


def test_warm_up_steps_change_nothing():
    args = EngineArgs(model="tiny-llama", load_format="dummy", max_model_len=128,
                      num_gpu_blocks=64)
    ref = _tokens(LLMEngine.from_engine_args(args))
    eng = LLMEngine.from_engine_args(args)
    assert eng.executor.warm_up_steps()  # the builder runs it on GPUs only
    assert not any(r.startswith("__warm") for r in eng.executor.block_tables.row_of)
    assert _tokens(eng) == ref
    eng.check_integrity()


def test_warm_up_steps_fit_few_seats():
    """The warm-up batches stay within the block tables' rows, however few seats."""
    for seats in (1, 2, 4):
        args = EngineArgs(model="tiny-llama", load_format="dummy", max_model_len=128,
                          num_gpu_blocks=64, max_num_seqs=seats)
        eng = LLMEngine.from_engine_args(args)
        assert eng.executor.warm_up_steps()
        assert not eng.executor.block_tables.row_of
        eng.check_integrity()


def test_pad_rows_to_graph_sizes():
    import numpy as np

    from kvtier.runner.host_batch import pad_rows

    sizes = [1, 2, 4, 8, 16]
    assert pad_rows(np.array([3, 7, 9]), sizes).tolist() == [3, 7, 9, 9]
    assert pad_rows(np.array([5]), sizes).tolist() == [5]
    assert pad_rows(np.arange(20), sizes).tolist() == list(range(20))  # past every size
    assert pad_rows(np.array([], dtype=np.int64), sizes).tolist() == []


def test_graph_batch_sizes_reach_the_cap():
    import pytest

    from kvtier.config import ConfigError
    from kvtier.core.graph_sizes import graph_batch_sizes

    assert graph_batch_sizes(1024)[-2:] == [508, 512]  # vLLM's default cap
    assert graph_batch_sizes(1024, 1024)[-3:] == [1016, 1020, 1024]
    assert graph_batch_sizes(100)[-2:] == [96, 100]  # the scheduler's largest batch too
    assert graph_batch_sizes(1024)[:5] == [1, 2, 4, 8, 16]
    # every 8 up to 128, where padding is free (memory bound), then every 4
    assert graph_batch_sizes(1024, 160)[17:] == [120, 128, 132, 136, 140, 144, 148, 152, 156, 160]
    assert graph_batch_sizes(1024, 100)[-2:] == [96, 100]
    assert graph_batch_sizes(1) == [1]
    sizes = graph_batch_sizes(700, 1024)
    assert sizes == sorted(set(sizes)) and sizes[-1] == 700
    with pytest.raises(ConfigError, match="max_graph_batch_size"):
        EngineArgs(model="tiny-llama", load_format="dummy",
                   max_graph_batch_size=0).create_engine_config()
