"""Can a large decode step hide its attention under its GEMMs (NanoFlow's nano-batching)?

A decode step of the offline ShareGPT run at 700-1000 requests spends ~20 ms in cuBLAS GEMMs
(compute-bound, at the power cap) and ~5-7 ms in the paged decode attention (HBM-bound),
one after the other. Cut the batch in two halves A and B on two streams: while the side
stream attends A, the main stream runs B's GEMMs, and the other way round:

    main:  preA(0) preB(0) | postA(0) preA(1) | postB(0) preB(1) | postA(1) ...
    side:          attnA(0) |        attnB(0) |        attnA(1)  | ...

pre = fused add+RMSNorm and the QKV GEMM; post = O projection, add+RMSNorm, gate_up GEMM,
SiLU*mul, down GEMM. Every variant is captured in one CUDA graph (32 llama-3.1-8b layers,
distinct weights, the decode contexts of the offline run at a given step, F = 4 pool) and
timed by replays, variants interleaved so they share the board's power state:

  sequential      the engine's order today, one stream, whole batch;
  halves          the same work in two halves, one stream (what splitting the GEMMs costs);
  overlap         the two-stream schedule above;
  overlap_smN     the same with cuBLAS asked to leave N SMs to the attention
                  (torch._C._set_sm_carveout_experimental), where the GEMMs' persistent
                  programs would otherwise hold every SM.

  python -m benchmarks.experiments.bench_microbatch_overlap \
      --workload .carry/sharegpt_llama31_1000.json \
      --out results/experiments/microbatch_overlap_h200.json
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import median_replay_s, monitored, write_result
from benchmarks.kernels.bench_kernels import sharegpt_step_lens
from kvtier.kernels.paged_decode_attention import paged_decode_attention
from kvtier.kernels.paged_decode_launch import choose_num_splits
from kvtier.kernels.rms_norm import fused_add_rms_norm
from kvtier.kernels.silu_and_mul import silu_and_mul

HIDDEN, INTER, HQ, HKV, D, LAYERS, F_LAYERS, BLOCK = 4096, 14336, 32, 8, 128, 32, 4, 16


class Layers:
    """Weights of LAYERS llama-3.1-8b layers and a pool holding the batch's context."""

    def __init__(self, lens: torch.Tensor):
        w = dict(device="cuda", dtype=torch.bfloat16)
        self.qkv = [torch.randn(HQ * D + 2 * HKV * D, HIDDEN, **w) * 0.02 for _ in range(LAYERS)]
        self.o = [torch.randn(HIDDEN, HQ * D, **w) * 0.02 for _ in range(LAYERS)]
        self.gate_up = [torch.randn(2 * INTER, HIDDEN, **w) * 0.02 for _ in range(LAYERS)]
        self.down = [torch.randn(HIDDEN, INTER, **w) * 0.02 for _ in range(LAYERS)]
        self.norm = torch.ones(HIDDEN, **w)
        nb = -(-lens // BLOCK)
        groups = LAYERS // F_LAYERS
        self.pool = torch.randn(groups, int(nb.sum()), F_LAYERS, 2, BLOCK, HKV, D, **w)
        width = int(nb.max())
        perm = torch.randperm(int(nb.sum()), device="cuda", dtype=torch.int32)
        self.tables = torch.zeros(len(lens), width, dtype=torch.int32, device="cuda")
        at = 0
        for b, n in enumerate(nb.tolist()):
            self.tables[b, :n] = perm[at:at + n]
            at += n
        self.seq_lens = lens.to(torch.int32).cuda()
        self.max_len = int(lens.max())

    def layer_cache(self, layer: int) -> torch.Tensor:
        return self.pool[layer // F_LAYERS][:, layer % F_LAYERS]


class Half:
    """Activations of a run of rows [lo, hi) of the batch, and its per-layer pieces."""

    def __init__(self, m: Layers, lo: int, hi: int):
        self.m, self.lo, self.hi = m, lo, hi
        n = hi - lo
        self.x = torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16)
        self.residual = torch.randn_like(self.x)
        self.attn_out = torch.empty(n, HQ, D, device="cuda", dtype=torch.bfloat16)
        self.q = torch.empty(n, HQ, D, device="cuda", dtype=torch.bfloat16)
        self.splits = choose_num_splits(self.q, m.layer_cache(0), m.max_len)

    def pre(self, layer: int) -> None:
        h, self.residual = fused_add_rms_norm(self.x, self.residual, self.m.norm, 1e-5)
        qkv = F.linear(h, self.m.qkv[layer])
        self.q = qkv[:, :HQ * D].view(-1, HQ, D)

    def attend(self, layer: int) -> None:
        m = self.m
        paged_decode_attention(
            self.q, m.layer_cache(layer), m.tables[self.lo:self.hi], m.seq_lens[self.lo:self.hi],
            D ** -0.5, out=self.attn_out, max_seq_len=m.max_len, num_splits=self.splits,
        )

    def post(self, layer: int) -> None:
        o = F.linear(self.attn_out.view(-1, HQ * D), self.m.o[layer])
        h, self.residual = fused_add_rms_norm(o, self.residual, self.m.norm, 1e-5)
        self.x = F.linear(silu_and_mul(F.linear(h, self.m.gate_up[layer])), self.m.down[layer])


def sequential(halves: list[Half]) -> None:
    for layer in range(LAYERS):
        for h in halves:
            h.pre(layer)
            h.attend(layer)
            h.post(layer)


def overlapped(a: Half, b: Half, side: torch.cuda.Stream) -> None:
    main = torch.cuda.current_stream()
    side.wait_stream(main)
    a.pre(0)
    ready_a = main.record_event()
    b.pre(0)
    ready_b = main.record_event()
    for layer in range(LAYERS):
        with torch.cuda.stream(side):
            side.wait_event(ready_a)
            a.attend(layer)
            done_a = side.record_event()
            side.wait_event(ready_b)
            b.attend(layer)
            done_b = side.record_event()
        main.wait_event(done_a)
        a.post(layer)
        if layer + 1 < LAYERS:
            a.pre(layer + 1)
            ready_a = main.record_event()
        main.wait_event(done_b)
        b.post(layer)
        if layer + 1 < LAYERS:
            b.pre(layer + 1)
            ready_b = main.record_event()
    main.wait_stream(side)


def capture(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    fn()  # compile and warm up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def with_carveout(sms: int, fn: Callable[[], None]) -> Callable[[], None]:
    def run() -> None:
        torch._C._set_sm_carveout_experimental(sms)
        try:
            fn()
        finally:
            torch._C._set_sm_carveout_experimental(None)
    return run


def bench_step(workload: str, step: int, carveouts: list[int], rounds: int) -> dict[str, Any]:
    lens = sharegpt_step_lens(workload, step)
    lens = lens[torch.randperm(len(lens))]  # the engine's rows are in no length order
    m = Layers(lens)
    n = len(lens)
    whole, a, b = Half(m, 0, n), Half(m, 0, n // 2), Half(m, n // 2, n)
    side = torch.cuda.Stream()
    variants: dict[str, Callable[[], None]] = {
        "sequential": lambda: sequential([whole]),
        "halves": lambda: sequential([a, b]),
        "overlap": lambda: overlapped(a, b, side),
    }
    for sms in carveouts:
        variants[f"overlap_sm{sms}"] = with_carveout(sms, lambda: overlapped(a, b, side))
        variants[f"sequential_sm{sms}"] = with_carveout(sms, lambda: sequential([whole]))
    graphs = {k: capture(fn) for k, fn in variants.items()}
    # The attention alone and the GEMM-side work alone, to read the overlap against.
    graphs["attention_only"] = capture(lambda: [whole.attend(i) for i in range(LAYERS)])
    times: dict[str, list[float]] = {k: [] for k in graphs}
    gpu: dict[str, Any] = {}
    for _ in range(rounds):  # interleaved: every variant sees the same power state
        for k, g in graphs.items():
            t, gpu[k] = monitored(lambda g=g: median_replay_s(g, 10))
            times[k].append(t)
    ms = {k: round(1e3 * statistics.median(v), 3) for k, v in times.items()}
    base = ms["sequential"]
    print(step, n, ms, flush=True)
    return {"step": step, "batch": n, "mean_context": round(float(lens.float().mean()), 1),
            "ms": ms, "vs_sequential": {k: round(v / base, 4) for k, v in ms.items()},
            "gpu": gpu}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--workload", required=True)
    p.add_argument("--steps", type=int, nargs="+", default=[12, 200, 400])
    p.add_argument("--carveouts", type=int, nargs="*", default=[16, 32])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.manual_seed(0)
    rows = []
    for step in args.steps:
        rows.append(bench_step(args.workload, step, args.carveouts, args.rounds))
        torch.cuda.empty_cache()
    write_result(args.out, {"model": "llama-3.1-8b", "layers": LAYERS, "F": F_LAYERS,
                            "options": vars(args), "steps": rows})


if __name__ == "__main__":
    main()
