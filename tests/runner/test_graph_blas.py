"""The decode graphs' BLAS choice: cuBLASLt only when clearly faster, torch's preference
restored after capture, and a tuned bf16 engine that still agrees with the CPU."""

import pytest
import torch

from kvtier import LLM, SamplingParams
from kvtier.runner.graph_blas import MIN_GAIN, faster_library, preferred_blas, tunes_blas
from tests.hf_models import save_tiny_model
from tests.runner.test_gpu_path import PROMPTS, greedy_tokens


def test_cublaslt_is_kept_only_when_clearly_faster():
    assert faster_library({"cublas": 10.0, "cublaslt": 9.0}) == "cublaslt"
    assert faster_library({"cublas": 10.0, "cublaslt": 10.0 * (1 - MIN_GAIN / 2)}) == "cublas"
    assert faster_library({"cublas": 10.0, "cublaslt": 11.0}) == "cublas"


def test_no_preference_leaves_torch_alone():
    before = torch.backends.cuda.preferred_blas_library()
    with preferred_blas(None):
        assert torch.backends.cuda.preferred_blas_library() == before
    assert torch.backends.cuda.preferred_blas_library() == before


def test_cpu_and_fp32_models_are_not_tuned(tmp_path):
    path = save_tiny_model("llama-gqa", tmp_path)
    llm = LLM(str(path), dtype="float32", max_model_len=128, device="cpu")
    assert not tunes_blas(llm.engine.executor.model)


@pytest.mark.gpu
def test_gpu_bf16_graphs_tuned_per_size_and_agree(tmp_path):
    path = save_tiny_model("llama-gqa", tmp_path)
    cpu, _ = greedy_tokens(path, device="cpu")
    before = torch.backends.cuda.preferred_blas_library()
    llm = LLM(str(path), dtype="bfloat16", max_model_len=128, kv_cache_gb=1.0,
              max_num_seqs=16)
    graphs = llm.engine.executor.graphs
    assert torch.backends.cuda.preferred_blas_library() == before
    assert set(graphs.blas) == set(graphs.sizes) == set(graphs.blas_times)
    assert all(graphs.blas[b] == faster_library(graphs.blas_times[b]) for b in graphs.sizes)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                        SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True))
    llm.engine.check_integrity()
    first = [o.outputs[0].token_ids[0] == c[0] for o, c in zip(outs, cpu)]
    assert sum(first) >= 3  # bf16 rounding may flip late tokens, rarely the first
    untuned = LLM(str(path), dtype="bfloat16", max_model_len=128, kv_cache_gb=1.0,
                  max_num_seqs=16, tune_graph_blas=False)
    assert set(untuned.engine.executor.graphs.blas.values()) == {None}
