"""Which BLAS library a decode graph's GEMMs are captured with: cuBLAS or cuBLASLt, whichever
ran the model's linear layers faster at that graph's batch size when it was captured.

torch calls cuBLAS for a bf16 `F.linear` unless cuBLASLt is its preferred library, and the two
pick different kernels by their own heuristics. Neither wins everywhere: timed one GEMM at a
time on the H200 over a decode step's layers (benchmarks/results/gemm_shapes_h200.json,
`python benchmarks/bench_gemm_shapes.py --out ...`), cuBLASLt's step is 3-5 % faster at 32,
64, 96 and 768 tokens and 2-6 % slower at 256, 664 and 1,024. A graph replays the kernels it
was captured with, so each batch size can keep its own choice at no cost per step (what
TensorRT-LLM's GEMM profiling does at engine build). The timing reads one layer's four
weights and the LM head, which together overflow the 60 MB L2 as a step does; the libraries
alternate over a few rounds, and cuBLASLt is kept only when clearly faster (`MIN_GAIN`).
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Iterator

import torch
import torch.nn.functional as F

from kvtier.model.llama import DecoderLayer, LlamaForCausalLM

LIBRARIES = ("cublas", "cublaslt")
MIN_GAIN = 0.02  # cuBLASLt must be this much faster: closer than that is timing noise
ROUNDS = 3
PASSES = 2  # passes over the five GEMMs in one timed interval


@contextlib.contextmanager
def preferred_blas(library: str | None) -> Iterator[None]:
    """torch's preferred BLAS library inside the block (None: leave it as it is)."""
    if library is None:
        yield
        return
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(before)


def _linears(model: LlamaForCausalLM, tokens: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, weight) of a decode step's GEMMs at `tokens` rows: layer 0's four and the head."""
    layer = model.layers[0]
    assert isinstance(layer, DecoderLayer)
    head = model.embed if model.lm_head is None else model.lm_head
    weights = [layer.attn.qkv_weight, layer.attn.o_weight, layer.mlp.gate_up_weight,
               layer.mlp.down_weight, head]
    return [(torch.randn(tokens, w.shape[1], dtype=w.dtype, device=w.device) * 0.5, w)
            for w in weights]


def _time_ms(linears: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(PASSES):
        for x, w in linears:
            F.linear(x, w)
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / PASSES


@torch.inference_mode()
def time_libraries(model: LlamaForCausalLM, tokens: int) -> dict[str, float]:
    """Median milliseconds of one pass over the step's GEMMs, per library."""
    linears = _linears(model, tokens)
    times: dict[str, list[float]] = {lib: [] for lib in LIBRARIES}
    for lib in LIBRARIES:  # warm-up: each library's first call sets up its handles
        with preferred_blas(lib):
            _time_ms(linears)
    for _ in range(ROUNDS):
        for lib in LIBRARIES:
            with preferred_blas(lib):
                times[lib].append(_time_ms(linears))
    return {lib: statistics.median(t) for lib, t in times.items()}


def faster_library(times: dict[str, float]) -> str:
    """cuBLASLt if it beat cuBLAS by MIN_GAIN, else cuBLAS (torch's default)."""
    return "cublaslt" if times["cublaslt"] < (1.0 - MIN_GAIN) * times["cublas"] else "cublas"


def tunes_blas(model: LlamaForCausalLM) -> bool:
    """Only bf16/fp16 on CUDA: the GEMMs the two libraries pick different kernels for."""
    p = model.embed
    return p.device.type == "cuda" and p.dtype in (torch.bfloat16, torch.float16)
