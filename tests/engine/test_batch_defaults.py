"""The offline LLM's batch limits follow vLLM's LLM class on large GPUs, and only there."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kvtier.engine import batch_defaults
from kvtier.engine.batch_defaults import offline_batch_defaults
from kvtier.entrypoints import llm as llm_module
from kvtier.entrypoints.llm import LLM

GiB = 1 << 30


def _fake_gpu(monkeypatch, name: str, gib: int) -> None:
    monkeypatch.setattr(batch_defaults.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(batch_defaults.torch.cuda, "get_device_properties",
                        lambda index: SimpleNamespace(name=name, total_memory=gib * GiB))


@pytest.mark.parametrize("name,gib,large", [("NVIDIA H200", 141, True),
                                            ("NVIDIA H100 80GB HBM3", 80, True),
                                            ("NVIDIA A100-SXM4-80GB", 80, False),
                                            ("NVIDIA L40S", 45, False)])
def test_large_gpus_get_vllms_offline_limits(monkeypatch, name, gib, large):
    _fake_gpu(monkeypatch, name, gib)
    got = offline_batch_defaults({})
    if large:
        assert got == {"max_num_seqs": 1024, "max_num_batched_tokens": 16384,
                       "max_graph_batch_size": 1024}
    else:
        assert got == {}
    assert offline_batch_defaults({"device": "cpu"}) == {}


def test_given_limits_win_and_unchunked_prefill_keeps_its_budget(monkeypatch):
    _fake_gpu(monkeypatch, "NVIDIA H200", 141)
    got = offline_batch_defaults({"max_num_seqs": 8, "enable_chunked_prefill": False})
    assert got == {"max_graph_batch_size": 1024}


def test_no_gpu_no_change():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert offline_batch_defaults({}) == {}


def test_llm_applies_the_defaults_under_its_own_options(monkeypatch):
    monkeypatch.setattr(llm_module, "offline_batch_defaults",
                        lambda options: {"max_num_seqs": 7, "max_num_batched_tokens": 96})
    llm = LLM("tiny-llama", load_format="dummy", max_model_len=64, max_num_batched_tokens=64)
    sched = llm.engine.config.scheduler
    assert (sched.max_num_seqs, sched.max_num_batched_tokens) == (7, 64)
    llm.engine.close()
