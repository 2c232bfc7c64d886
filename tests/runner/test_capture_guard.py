"""CUDA graph captures run with the cyclic garbage collector collected first and then off: a
dead engine's CUDA graphs destroyed by a collection inside a capture invalidate it (see
kvtier/runner/capture_guard.py). On the CPU, with torch.cuda's capture calls faked."""

from __future__ import annotations

import gc

import pytest
import torch

from kvtier import LLM
from kvtier.runner.capture_guard import collector_paused
from kvtier.runner.cuda_graphs import DecodeGraphs
from kvtier.runner.piecewise_graphs import PiecewiseGraphs


class _Cycle:
    """Garbage only the cyclic collector frees; `log` gets its name when it is freed."""

    def __init__(self, name: str, log: list[str]):
        self.me, self.name, self.log = self, name, log

    def __del__(self):
        self.log.append(self.name)


def test_collects_first_then_pauses_and_restores_on_error():
    log: list[str] = []
    _Cycle("before", log)
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector_paused():
        assert log == ["before"] and not gc.isenabled()
        _Cycle("inside", log)
        junk = [[] for _ in range(50_000)]  # tracked allocations far past the thresholds
        del junk
        assert log == ["before"]
        raise RuntimeError
    assert gc.isenabled()
    gc.collect()
    assert log == ["before", "inside"]


def test_leaves_a_disabled_collector_disabled():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


class _FakeGraph:
    def pool(self) -> str:
        return "pool"


def _fake_cuda_capture(monkeypatch) -> list[tuple[bool, list[str]]]:
    """torch.cuda's capture calls, recording the collector's state and the dead objects
    freed so far at each capture."""
    seen: list[tuple[bool, list[str]]] = []
    freed: list[str] = []

    class FakeCapture:
        def __init__(self, graph, pool=None, **kwargs):
            pass

        def __enter__(self):
            seen.append((gc.isenabled(), list(freed)))

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", _FakeGraph)
    monkeypatch.setattr(torch.cuda, "graph", FakeCapture)
    _Cycle("dead engine", freed)
    return seen


def _runner():
    llm = LLM("tiny-llama-gqa", load_format="dummy", attention_backend="torch",
              max_model_len=32, num_gpu_blocks=16, block_size=4, layers_per_block=2,
              max_num_batched_tokens=16, max_num_seqs=4)
    return llm, llm.engine.executor


@pytest.mark.parametrize("graphs", ["piecewise", "decode"])
def test_every_capture_runs_with_the_collector_paused(monkeypatch, graphs):
    llm, runner = _runner()
    seen = _fake_cuda_capture(monkeypatch)
    if graphs == "piecewise":
        built = PiecewiseGraphs(runner, capture=True, keep_attention_inputs=True)
    else:
        built = DecodeGraphs(runner, scratch_block=len(runner.gpu_kv) - 1)
    built.capture()
    assert len(seen) == len(built.graphs) > 1
    assert all(not enabled and freed == ["dead engine"] for enabled, freed in seen), seen
    assert gc.isenabled()
