"""cuBLAS on the decode steps' GEMMs, against their floors: which shapes fall short, and
whether a cheap change of call (padding the token count, a pre-transposed weight, cuBLASLt
as the preferred backend) gets them closer.

The offline ShareGPT run's decode steps spend 64 % of their floor in the linear layers at
~178 requests and 95 % at ~1,000 (results/offline/profile_offline_decode_h200_skip*.json):
near the ridge point (~180 tokens) the GEMMs are neither cleanly memory- nor compute-bound.
Each row times one linear of the model at m tokens, inside a CUDA graph of 20 calls that
cycle over enough weight copies to miss the 60 MB L2 (bench_kernels.time_graph), as a
decode step reads each layer's weights once. Floor: the larger of (weights + activations) at 4.24 TB/s and 2mnk at
761 TFLOP/s.

  python -m benchmarks.kernels.bench_gemm_shapes --out results/kernels/gemm_shapes_h200.json
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import H200_BF16_FLOPS, H200_HBM_BYTES_PER_S, write_result
from benchmarks.kernels.bench_kernels import copies_past_l2, time_graph
from kvtier.costmodel.operators import Shapes
from kvtier.model.loader import resolve_model_config

TOKENS = (1, 16, 32, 64, 96, 128, 176, 256, 384, 512, 664, 768, 984, 1024)


def floor_s(m: int, n: int, k: int, elem: int = 2) -> float:
    """The GEMM's roofline: bytes moved or FLOPs, whichever takes longer."""
    moved = elem * (n * k + m * k + m * n)
    return max(moved / H200_HBM_BYTES_PER_S, 2.0 * m * n * k / H200_BF16_FLOPS)


def round_up(m: int, multiple: int) -> int:
    return -(-m // multiple) * multiple


def variants(x: torch.Tensor, weights: list[torch.Tensor], m: int
             ) -> dict[str, list[Callable[[], object]]]:
    """The same product called three ways (pad64 computes the m rows and the padding's).

    pad64's first m rows are x itself: an all-zero operand runs the same GEMM up to ~20 %
    faster on the H200 (lower power, higher clocks; the first run of this script, with a
    zero-filled buffer, measured that rather than the padding)."""
    padded = torch.zeros(round_up(m, 64), x.shape[1], dtype=x.dtype, device=x.device)
    padded[:m] = x
    transposed = [w.t().contiguous() for w in weights]
    return {
        "linear": [lambda w=w: F.linear(x, w) for w in weights],
        "pad64": [lambda w=w: F.linear(padded, w) for w in weights],
        "transposed": [lambda w=w: x @ w for w in transposed],
    }


def bench_shape(name: str, n: int, k: int, tokens: tuple[int, ...]) -> list[dict]:
    copies = copies_past_l2(2 * n * k)
    weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
               for _ in range(copies)]
    rows = []
    for m in tokens:
        x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
        floor = floor_s(m, n, k)
        row = {"gemm": name, "m": m, "n": n, "k": k, "floor_us": floor * 1e6}
        for variant, calls in variants(x, weights, m).items():
            t = time_graph(calls)
            row[f"{variant}_us"] = t * 1e6
            row[f"{variant}_of_floor"] = floor / t
        row.update(_cublaslt(x, weights, floor))
        rows.append(row)
        print({key: round(v, 3) if isinstance(v, float) else v for key, v in row.items()},
              flush=True)
    del weights
    torch.cuda.empty_cache()
    return rows


def _cublaslt(x: torch.Tensor, weights: list[torch.Tensor], floor: float) -> dict:
    """F.linear with cuBLASLt as torch's preferred BLAS (the default is cuBLAS)."""
    before = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        t = time_graph([lambda w=w: F.linear(x, w) for w in weights])
    finally:
        torch.backends.cuda.preferred_blas_library(before)
    return {"cublaslt_us": t * 1e6, "cublaslt_of_floor": floor / t}


def per_step(rows: list[dict], num_layers: int) -> list[dict]:
    """A decode step's linear layers at each token count: every layer's four GEMMs plus the
    LM head, by variant (and the best variant per GEMM)."""
    out = []
    names = ("linear", "pad64", "transposed", "cublaslt")
    for m in sorted({r["m"] for r in rows}):
        at = [r for r in rows if r["m"] == m]
        weight = [num_layers if r["gemm"] != "lm_head" else 1 for r in at]
        step = {"m": m, "floor_ms": sum(w * r["floor_us"] for w, r in zip(weight, at)) / 1e3}
        for v in names:
            step[f"{v}_ms"] = sum(w * r[f"{v}_us"] for w, r in zip(weight, at)) / 1e3
        step["best_ms"] = sum(w * min(r[f"{v}_us"] for v in names)
                              for w, r in zip(weight, at)) / 1e3
        out.append(step)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("bench_gemm_shapes times cuBLAS: it needs a GPU")
    mc, _ = resolve_model_config(args.model, "dummy")
    rows = []
    for name, (n, k) in Shapes.of(mc).gemm_dims().items():
        rows += bench_shape(name, n, k, TOKENS)
    steps = per_step(rows, mc.num_layers)
    for s in steps:
        print({key: round(v, 3) if isinstance(v, float) else v for key, v in s.items()})
    write_result(args.out, {"model": args.model, "gemms": rows,
                            "per_step": steps})


if __name__ == "__main__":
    main()
