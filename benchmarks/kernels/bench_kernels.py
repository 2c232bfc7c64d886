"""GPU microbenchmark of the attention kernels against the hardware's limits.

Decode: split-K paged decode attention, batch {1,16,64,256} x context {512,2048,8192}, for
llama-3.1-8b (32 q / 8 kv heads, D=128) and llama-2-13b (40/40, D=128), bf16. Achieved
bandwidth = (KV bytes read + q and out bytes) / time, against the 4.24 TB/s HBM copy roofline
(and a copy measured in the same run). One layer's KV; small shapes rotate over several
layers' worth of pools so they are not served from the 60 MB L2. Times are CUDA-graph replays
(the engine replays decode steps as graphs), so the Python wrapper's cost is excluded.

Prefill: one fresh causal prompt of 2k/8k/32k tokens through the paged prefill kernel;
TFLOP/s = 2 * 2 * Hq * D * L^2 / 2 / time, beside torch's flash SDPA on the same shape.

    python -m benchmarks.kernels.bench_kernels --out results.json [--sweep]
    python -m benchmarks.kernels.bench_kernels --parts short_context --out s.json  # tiles
    python -m benchmarks.kernels.bench_kernels --parts mixed_context --out mixed.json  # split caps
    python -m benchmarks.kernels.bench_kernels --parts sharegpt_context --out sg.json  # run's
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import triton

from benchmarks.common import median_replay_s
from kvtier.kernels.paged_decode_attention import paged_decode_attention
from kvtier.kernels.paged_decode_launch import default_num_splits, programs_per_sm
from kvtier.kernels.paged_prefill_attention import paged_prefill_attention

HBM_ROOFLINE_GBPS = 4240.0  # measured H200 device-to-device copy (DESIGN.md, hw/)
GEMM_PEAK_TFLOPS = 761.0  # measured bf16 GEMM
MODELS = {"llama-3.1-8b": (32, 8, 128), "llama-2-13b": (40, 40, 128)}
BLOCK_SIZE = 16
L2_BYTES = 60 << 20


def copies_past_l2(nbytes: int, least: int = 1, most: int | None = None) -> int:
    """How many copies of an `nbytes` input to cycle through so that calls read from HBM,
    not L2: enough to fill L2 four times over, within [least, most]."""
    n = max(least, -(-4 * L2_BYTES // nbytes))
    return n if most is None else min(most, n)


def pct_of_hbm(nbytes: int, seconds: float) -> float:
    """Bytes moved in `seconds` as a percentage of the HBM roofline, one decimal."""
    return round(100 * nbytes / seconds / 1e9 / HBM_ROOFLINE_GBPS, 1)


def time_graph(calls: Sequence[Callable[..., Any]], reps: int = 10) -> float:
    """Median seconds per call: capture all calls (at least 20, cycling) in one CUDA graph
    and time its replays with events."""
    for c in calls:  # compile + warm up outside the graph
        c()
    torch.cuda.synchronize()
    n = max(20, len(calls))
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        calls[0]()  # allocator warm-up on the capture stream
        with torch.cuda.graph(graph, stream=stream):
            for i in range(n):
                calls[i % len(calls)]()
    graph.replay()
    torch.cuda.synchronize()
    return median_replay_s(graph, reps) / n


def copy_bandwidth_gbps() -> float:
    """Device-to-device copy, bytes read + written: this run's own ceiling."""
    src = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    t = triton.testing.do_bench(lambda: dst.copy_(src), return_mode="median") / 1e3
    return 2 * src.numel() / t / 1e9


def _decode_setup(lens: torch.Tensor, hq: int, hkv: int, d: int, F: int = 1
                  ) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Requests of contexts `lens`: pools of F layers a block for `copies` layers (so the
    working set exceeds L2), one layer of each viewed, and random block tables."""
    batch = len(lens)
    kv_bytes = int(lens.sum()) * hkv * d * 2 * 2
    copies = copies_past_l2(kv_bytes, most=16)
    nb_per_req = -(-int(lens.max()) // BLOCK_SIZE)
    num_blocks = batch * nb_per_req
    pools = []
    for _ in range(copies):
        pool = torch.empty(num_blocks, F, 2, BLOCK_SIZE, hkv, d, dtype=torch.bfloat16,
                           device="cuda")
        pool.normal_()
        pools.append(pool[:, F - 1])
    tables = torch.randperm(num_blocks, device="cuda", dtype=torch.int32).view(batch, nb_per_req)
    seq_lens = lens.to(torch.int32).cuda()
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    return pools, tables, seq_lens, q, kv_bytes


def _time_decode(pools: list[torch.Tensor], tables: torch.Tensor, seq_lens: torch.Tensor,
                 q: torch.Tensor, kv_bytes: int, **kernel_kw: Any) -> dict[str, Any]:
    """Graph-replayed decode over each pool in turn; frees the pools. Bandwidth counts the
    KV read plus q and out."""
    out = torch.empty_like(q)
    calls = [
        (lambda p=p: paged_decode_attention(q, p, tables, seq_lens, q.shape[-1] ** -0.5,
                                            out=out, **kernel_kw))
        for p in pools
    ]
    t = time_graph(calls)
    moved = kv_bytes + 2 * q.numel() * q.element_size()
    pools.clear()
    torch.cuda.empty_cache()
    gbps = moved / t / 1e9
    return {"time_us": round(t * 1e6, 2), "bytes": moved, "GBps": round(gbps, 1),
            "pct_roofline": round(100 * gbps / HBM_ROOFLINE_GBPS, 1)}


def bench_decode(model: str, batch: int, ctx: int, F: int = 1, **kw: Any) -> dict[str, Any]:
    hq, hkv, d = MODELS[model]
    pools, tables, seq_lens, q, kv_bytes = _decode_setup(torch.full((batch,), ctx), hq, hkv,
                                                         d, F)
    splits = kw.pop("num_splits", None) or default_num_splits(
        batch, hkv, ctx, torch.cuda.get_device_properties(0).multi_processor_count)
    timed = _time_decode(pools, tables, seq_lens, q, kv_bytes, num_splits=splits, **kw)
    return {"model": model, "batch": batch, "context": ctx, "F": F, "num_splits": splits,
            **kw, **timed}


def bench_prefill(model: str, length: int, **kw: Any) -> dict[str, Any]:
    hq, hkv, d = MODELS[model]
    nb = -(-length // BLOCK_SIZE)
    pool = torch.randn(nb, 1, 2, BLOCK_SIZE, hkv, d, dtype=torch.bfloat16, device="cuda")
    layer = pool[:, 0]
    tables = torch.randperm(nb, device="cuda", dtype=torch.int32).view(1, nb)
    seq_lens = torch.tensor([length], dtype=torch.int32, device="cuda")
    qsl = torch.tensor([0, length], dtype=torch.int32, device="cuda")
    q = torch.randn(length, hq, d, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(q)
    flops = 4 * hq * d * length * length / 2  # QK^T and PV, causal half

    def ours() -> None:
        paged_prefill_attention(q, layer, tables, seq_lens, qsl, d**-0.5, out=out, **kw)

    t = triton.testing.do_bench(ours, warmup=50, rep=300, return_mode="median") / 1e3
    row = {"model": model, "tokens": length, **kw, "time_ms": round(t * 1e3, 3),
           "tflops": round(flops / t / 1e12, 1),
           "pct_gemm_peak": round(100 * flops / t / 1e12 / GEMM_PEAK_TFLOPS, 1)}
    row["sdpa_flash_tflops"] = _sdpa_tflops(q, layer, length, hq, hkv, flops)
    del pool
    torch.cuda.empty_cache()
    return row


def _sdpa_tflops(q: torch.Tensor, layer: torch.Tensor, length: int, hq: int, hkv: int,
                 flops: float) -> float | None:
    """torch's FlashAttention-2 on contiguous K/V (GQA expanded), the reference point."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qh = q.transpose(0, 1).unsqueeze(0)  # [1, Hq, L, D]
    k = torch.randn(1, hkv, length, q.shape[-1], dtype=q.dtype, device="cuda")
    k = k.repeat_interleave(hq // hkv, dim=1)
    v = torch.randn_like(k)
    try:
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            fn = lambda: torch.nn.functional.scaled_dot_product_attention(  # noqa: E731
                qh, k, v, is_causal=True)
            t = triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median") / 1e3
    except RuntimeError as e:  # no flash kernel for this shape/build
        print("sdpa:", e)
        return None
    return round(flops / t / 1e12, 1)


def sweep() -> list[dict[str, Any]]:
    """Variants beside the defaults: split counts on the shapes whose SM filling depends on
    them, and prefill tile shapes (decode tile variants: see the first H200 run's notes)."""
    rows = []
    for model, batch, ctx, splits in (("llama-3.1-8b", 16, 8192, (2, 4, 5, 8)),
                                      ("llama-2-13b", 16, 2048, (1, 2, 4))):
        for n in splits:
            rows.append(bench_decode(model, batch, ctx, num_splits=n))
            print(rows[-1], flush=True)
    for model in MODELS:
        for v in (dict(block_m=128, block_n=32, num_warps=8), dict(block_m=128, block_n=64,
                  num_warps=8), dict(block_m=64, block_n=64, num_warps=4),
                  dict(block_m=64, block_n=32, num_warps=4, num_stages=3)):
            rows.append(bench_prefill(model, 8192, **v))
            print(rows[-1], flush=True)
    return rows


# Decode steps of the offline ShareGPT run at 1024 seats (benchmarks/offline/offline_floor.py's
# `steps_at_batch`: requests, mean context), where the attention reached 63-84 % of HBM,
# and the issue's two roofline targets, which a short-context rule must not slow down.
SHORT_CONTEXT_SHAPES = ((984, 107), (664, 297), (177, 627))
TARGET_SHAPES = ((256, 2048), (16, 8192))


def short_context_sweep(max_model_len: int = 4096) -> list[dict[str, Any]]:
    """Decode tile, pipeline depth and warps at the offline run's short contexts (llama-3.1-8b),
    the split count fixed from max_model_len as the engine's decode graphs fix it: with two
    64-token tiles a program the default's two resident programs per SM may not hide the
    latency of each program's dependent loads (block table, then K/V)."""
    hq, hkv, d = MODELS["llama-3.1-8b"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for batch, ctx in SHORT_CONTEXT_SHAPES + TARGET_SHAPES:
        for block_n in (32, 64):
            for num_stages in (1, 2, 3):
                for num_warps in (2, 4, 8):
                    per_sm = programs_per_sm(block_n, d, 2, num_stages)
                    splits = default_num_splits(batch, hkv, max(ctx, max_model_len), sms,
                                                per_sm)
                    rows.append(bench_decode("llama-3.1-8b", batch, ctx, num_splits=splits,
                                             block_n=block_n, num_stages=num_stages,
                                             num_warps=num_warps))
                    print(rows[-1], flush=True)
    return rows


# Batches the decode graphs pad to in the offline run's middle phase, where the graph's split
# count (from max_model_len) is 2-4 while most contexts are a few hundred tokens.
MIXED_BATCHES = (40, 72, 136, 184, 248, 272, 400, 664)
MIXED_MEAN_CONTEXTS = (150, 400, 1000)
# (split count: None = the graph's, tokens a split at least, pipeline stages); the first run
# of this sweep compared caps 1-1024 (kernels_mixed_context_h200_min_split.json).
MIXED_VARIANTS = ((None, 256, 3), (None, 1, 3), (1, 256, 3), (None, 256, 2), (1, 256, 2),
                  (1, 256, 1))


def bench_decode_mixed(batch: int, mean_ctx: int, min_split_tokens: int,
                       num_splits: int | None = None, num_stages: int = 3,
                       max_model_len: int = 4096, seed: int = 0) -> dict[str, Any]:
    """Decode over contexts drawn uniformly from [16, 2 x mean) (llama-3.1-8b), the split
    count fixed from max_model_len as a decode graph fixes it, each request capping its own
    splits at seq_len // min_split_tokens (1: every request takes the graph's count, as the
    kernel did before the cap)."""
    g = torch.Generator().manual_seed(seed + batch + mean_ctx)
    lens = torch.randint(16, 2 * mean_ctx, (batch,), generator=g)
    row = bench_decode_lens(lens, num_splits=num_splits, max_model_len=max_model_len,
                            num_stages=num_stages, min_split_tokens=min_split_tokens)
    return {**row, "context": mean_ctx}


def bench_decode_lens(lens: torch.Tensor, num_splits: int | None = None, F: int = 1,
                      max_model_len: int = 4096, model: str = "llama-3.1-8b",
                      **kernel_kw: Any) -> dict[str, Any]:
    """Decode of one layer over requests of the given contexts (llama-3.1-8b), in that order
    (program ids follow the rows), over randomly placed blocks of a pool of F layers a block;
    the split count fixed from max_model_len as a decode graph fixes it."""
    hq, hkv, d = MODELS[model]
    batch = len(lens)
    pools, tables, seq_lens, q, kv_bytes = _decode_setup(lens, hq, hkv, d, F)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    splits = num_splits or default_num_splits(batch, hkv, max_model_len, sms)
    timed = _time_decode(pools, tables, seq_lens, q, kv_bytes, num_splits=splits, **kernel_kw)
    return {"model": model, "batch": batch, "context": round(float(lens.float().mean())),
            "max_context": int(lens.max()), "F": F, "num_splits": splits, **kernel_kw, **timed}


def mixed_context_sweep() -> list[dict[str, Any]]:
    rows = []
    for batch in MIXED_BATCHES:
        for mean_ctx in MIXED_MEAN_CONTEXTS:
            for splits, m, stages in MIXED_VARIANTS:
                rows.append(bench_decode_mixed(batch, mean_ctx, m, splits, stages))
                print(rows[-1], flush=True)
    return rows


# Decode steps of the offline ShareGPT run (every request admitted and prefilled at once,
# then step s holds the requests with more than s output tokens at prompt + s tokens, in
# arrival order), where the attention reached 63-84 % of HBM in the run's profile.
SHAREGPT_STEPS = (12, 100, 200, 400, 600)
# (label, lens transform, kernel keywords): the graph's rule; the same lengths longest
# first (how much the long requests' programs trail the rest), sorted on the host or
# launched in that order through the kernel's `order` index; long requests split; one
# wave more of resident programs; the same tokens spread evenly (what the uniform
# sweeps measure).
SHAREGPT_VARIANTS = (
    ("graph", None, {}),
    ("longest_first", "sort", {}),
    ("order_longest_first", "order", {}),
    ("split4_256", None, {"num_splits": 4, "min_split_tokens": 256}),
    ("split8_128", None, {"num_splits": 8, "min_split_tokens": 128}),
    ("longest_first_split4", "sort", {"num_splits": 4, "min_split_tokens": 256}),
    ("block32_stages2", None, {"block_n": 32, "num_stages": 2}),
    ("uniform", "uniform", {}),
)


def sharegpt_step_lens(workload: str, step: int) -> torch.Tensor:
    """Contexts of the decode rows `step` steps into the offline run of `workload`."""
    requests = json.loads(Path(workload).read_text())["requests"]
    return torch.tensor([len(ids) + step for ids, out in requests if out > step])


# The run's tail: 6-120 requests of 700-1700 tokens, where the in-engine profile had the
# attention at 35-62 % of HBM (profile_offline_decode_h200_skip{740,850}_5b122b0.json). The
# graph's split count comes from max_model_len; a request splits no finer than
# min_split_tokens: shorter ranges (more programs), or more of them.
SHAREGPT_TAIL_STEPS = (600, 700, 740, 800, 850, 900)
SHAREGPT_TAIL_VARIANTS = (
    ("graph", None, {}),
    ("min128", None, {"min_split_tokens": 128}),
    ("min64", None, {"min_split_tokens": 64}),
    ("split8_128", None, {"num_splits": 8, "min_split_tokens": 128}),
    ("split16_64", None, {"num_splits": 16, "min_split_tokens": 64}),
    ("split32_64", None, {"num_splits": 32, "min_split_tokens": 64}),
    ("split16_64_block32", None, {"num_splits": 16, "min_split_tokens": 64, "block_n": 32}),
    ("uniform", "uniform", {}),
)


def sharegpt_context_sweep(workload: str, steps: tuple[int, ...] = SHAREGPT_STEPS,
                           variants: tuple = SHAREGPT_VARIANTS) -> list[dict[str, Any]]:
    rows = []
    for step in steps:
        lens = sharegpt_step_lens(workload, step)
        for label, transform, kw in variants:
            if transform == "sort":
                case = lens.sort(descending=True).values
            elif transform == "uniform":
                case = torch.full_like(lens, round(float(lens.float().mean())))
            else:
                case = lens
            if transform == "order":  # launch order from an index array, rows unsorted
                kw = {**kw, "order": lens.argsort(descending=True).to(torch.int32).cuda()}
            row = bench_decode_lens(case, F=4, **kw)
            row.pop("order", None)
            rows.append({"step": step, "variant": label, **row})
            print(rows[-1], flush=True)
    return rows


# Pipeline depth and warps of the split-free launches (three waves of programs or more, where
# the graphs of large batches run): the run's contexts in the engine's longest-first order,
# and uniform batches of long contexts.
STAGES_VARIANTS = ((64, 3, 4), (64, 2, 4), (64, 3, 2), (64, 2, 2))
# Smaller tiles, deeper pipelines: 32-token tiles hold 4-6 programs an SM at 3-4 stages.
TILES_VARIANTS = ((64, 3, 4), (32, 3, 2), (32, 4, 2), (32, 3, 4), (32, 4, 4), (64, 2, 4))


def stages_sweep(workload: str, variants: tuple = STAGES_VARIANTS) -> list[dict[str, Any]]:
    cases = [(f"sharegpt_step{s}", sharegpt_step_lens(workload, s)) for s in SHAREGPT_STEPS[:4]]
    cases += [(f"uniform_{b}x{c}", torch.full((b,), c)) for b, c in ((256, 2048), (128, 4096),
                                                                    (512, 1024))]
    rows = []
    for label, lens in cases:
        order = lens.argsort(descending=True).to(torch.int32).cuda()
        for block_n, stages, warps in variants:
            row = bench_decode_lens(lens, num_splits=1, F=4, block_n=block_n,
                                    num_stages=stages, num_warps=warps, order=order)
            row.pop("order", None)
            rows.append({"case": label, **row})
            print(rows[-1], flush=True)
    return rows


def tiles_mha_sweep() -> list[dict[str, Any]]:
    """llama-2-13b (40 KV heads, one query head each) at 4,096+ programs: the default tiles
    against the large-batch ones that grouped-query models take there."""
    from kvtier.kernels.paged_decode_launch import MANY_PROGRAMS_TILES as t

    rows = []
    for b, c in ((104, 512), (128, 256), (128, 1024), (256, 512), (104, 2048)):
        lens = torch.full((b,), c)
        for kw in ({}, {"block_n": t.block_n, "num_warps": t.num_warps,
                        "num_stages": t.num_stages}):
            rows.append(bench_decode_lens(lens, num_splits=1, F=4, model="llama-2-13b", **kw))
            print(rows[-1], flush=True)
    return rows


def argmax_sweep(vocab: int = 128256) -> list[dict[str, Any]]:
    """Greedy argmax over bf16 logits of Llama 3's vocabulary: torch's against the chunked
    kernel, graph-timed over copies that miss L2 (a step reads logits its LM head just
    wrote, partly from L2: this is the cold bound)."""
    from kvtier.kernels.argmax import argmax_rows

    rows = []
    for batch in (1, 8, 64, 256, 992):
        copies = copies_past_l2(batch * vocab * 2, least=2, most=16)
        xs = [torch.randn(batch, vocab, device="cuda").to(torch.bfloat16) for _ in range(copies)]
        row: dict[str, Any] = {"batch": batch, "vocab": vocab, "bytes": batch * vocab * 2}
        for name, fn in (("torch", lambda x: x.argmax(dim=-1)), ("triton", argmax_rows),
                         ("triton_block16k", lambda x: argmax_rows(x, block=16384))):
            t = time_graph([(lambda x=x, fn=fn: fn(x)) for x in xs])
            row[f"{name}_us"] = round(t * 1e6, 2)
            row[f"{name}_pct_roofline"] = pct_of_hbm(row["bytes"], t)
        assert all(torch.equal(argmax_rows(x), x.argmax(dim=-1)) for x in xs)
        rows.append(row)
        print(row, flush=True)
    return rows


def rotary_kv_write_sweep() -> list[dict[str, Any]]:
    """Rotary + KV write of one llama-3.1-8b layer (q, k, v views of its qkv output, an
    F = 4 pool): the two kernels apart against the fused one, graph-timed over layers whose
    inputs miss L2. Bytes: q read and written, k and v read and stored."""
    rows = []
    for tokens in (1, 6, 48, 256, 992, 16384):
        rows.append(_time_rotary_kv_write(tokens))
        print(rows[-1], flush=True)
    return rows


def _time_rotary_kv_write(tokens: int) -> dict[str, Any]:
    from kvtier.kernels.kv_write import kv_write
    from kvtier.kernels.rotary import rotary
    from kvtier.kernels.rotary_kv_write import rotary_kv_write

    hq, hkv, d = MODELS["llama-3.1-8b"]
    cos_sin = torch.randn(8192, d, device="cuda")
    per_token = 2 * (2 * hq * d + 4 * hkv * d)
    layers = copies_past_l2(tokens * per_token, least=2, most=16)
    blocks = -(-tokens // BLOCK_SIZE) + 1
    pool = torch.zeros(blocks, 4, 2, BLOCK_SIZE, hkv, d, dtype=torch.bfloat16, device="cuda")
    qkvs = [torch.randn(tokens, hq + 2 * hkv, d, device="cuda").to(torch.bfloat16)
            for _ in range(layers)]
    pos = torch.randint(0, 8192, (tokens,), device="cuda")
    slots = torch.randperm(blocks * BLOCK_SIZE, device="cuda")[:tokens]

    def apart(qkv: torch.Tensor, i: int) -> None:
        q, k = rotary(qkv[:, :hq], qkv[:, hq : hq + hkv], pos, cos_sin)
        kv_write(pool[:, i % 4], k, qkv[:, hq + hkv :], slots)

    def fused(qkv: torch.Tensor, i: int) -> None:
        rotary_kv_write(qkv[:, :hq], qkv[:, hq : hq + hkv], qkv[:, hq + hkv :], pos, cos_sin,
                        pool[:, i % 4], slots)

    row: dict[str, Any] = {"tokens": tokens, "bytes": tokens * per_token}
    for name, fn in (("apart", apart), ("fused", fused)):
        t = time_graph([(lambda x=x, i=i, fn=fn: fn(x, i)) for i, x in enumerate(qkvs)])
        row[f"{name}_us"] = round(t * 1e6, 2)
        row[f"{name}_pct_roofline"] = pct_of_hbm(row["bytes"], t)
    return row


RMS_NORM_TOKENS = (1, 16, 64, 256, 768, 1024, 16384)
RMS_NORM_WARPS = (2, 4, 8, 16)  # beside the wrapper's own choice


def rms_norm_sweep(hidden: int = 4096) -> list[dict[str, Any]]:
    """Residual add + RMSNorm of llama-3.1-8b's hidden state (x and residual read, the sum
    and the normed rows written), graph-timed over copies whose inputs miss L2, at each
    token count and each of the wrapper's warp counts."""
    from kvtier.kernels.rms_norm import fused_add_rms_norm

    rows = []
    for tokens in RMS_NORM_TOKENS:
        nbytes = 4 * tokens * hidden * 2
        copies = copies_past_l2(nbytes, least=2, most=16)
        xs = [torch.randn(2, tokens, hidden, device="cuda").to(torch.bfloat16)
              for _ in range(copies)]
        w = torch.randn(hidden, device="cuda").to(torch.bfloat16)
        row: dict[str, Any] = {"tokens": tokens, "bytes": nbytes}
        for warps in (None, *RMS_NORM_WARPS):
            t = time_graph([(lambda x=x, w=w, warps=warps: fused_add_rms_norm(
                x[0], x[1], w, 1e-5, num_warps=warps)) for x in xs])
            key = "default" if warps is None else f"warps{warps}"
            row[f"{key}_us"] = round(t * 1e6, 2)
            row[f"{key}_pct_roofline"] = pct_of_hbm(nbytes, t)
        rows.append(row)
        print(row, flush=True)
    return rows


def placement_sweep(pool_gb: float = 80.0) -> list[dict[str, Any]]:
    """Where a batch's KV blocks sit in a large pool (F = 4 blocks, llama-3.1-8b, batch 256 x
    2048 tokens, one layer timed): each request's blocks consecutive, the used blocks
    shuffled among themselves, or scattered over the whole pool (more pages to translate)."""
    hq, hkv, d = MODELS["llama-3.1-8b"]
    F, batch, ctx = 4, 256, 2048
    block_bytes = F * 2 * BLOCK_SIZE * hkv * d * 2
    total = int(pool_gb * (1 << 30)) // block_bytes
    pool = torch.empty(total, F, 2, BLOCK_SIZE, hkv, d, dtype=torch.bfloat16, device="cuda")
    layers = [pool[:, s] for s in range(F)]  # the F layers of a block, timed in turn
    nb = ctx // BLOCK_SIZE
    used = batch * nb
    q = torch.randn(batch, hq, d, dtype=torch.bfloat16, device="cuda")
    seq_lens = torch.full((batch,), ctx, dtype=torch.int32, device="cuda")
    layouts = {
        "consecutive": torch.arange(used, device="cuda", dtype=torch.int32),
        "shuffled_used": torch.randperm(used, device="cuda", dtype=torch.int32),
        "scattered_pool": torch.randperm(total, device="cuda", dtype=torch.int32)[:used],
    }
    kv_bytes = batch * ctx * hkv * d * 2 * 2
    rows = []
    for label, ids in layouts.items():
        timed = _time_decode(list(layers), ids.view(batch, nb), seq_lens, q, kv_bytes,
                             num_splits=1)
        rows.append({"placement": label, "batch": batch, "context": ctx, "F": F,
                     "pool_blocks": total, **timed})
        print(rows[-1], flush=True)
    del layers, pool
    torch.cuda.empty_cache()
    return rows


def grid_order_sweep() -> list[dict[str, Any]]:
    """The decode launch-order index at the issue's two target shapes and three more
    (uniform contexts, identity order): what reading each program's request through the
    index costs. (The first run, kernels_grid_order_h200.json at 09b3385, also timed a grid
    with requests varying fastest; KV heads fastest won or tied at every shape.)"""
    hq, hkv, d = MODELS["llama-3.1-8b"]
    rows = []
    for batch, ctx in TARGET_SHAPES + ((64, 2048), (16, 2048), (1, 8192)):
        for with_order in (False, True):
            kw: dict[str, Any] = {}
            if with_order:
                kw["order"] = torch.arange(batch, dtype=torch.int32, device="cuda")
            row = bench_decode("llama-3.1-8b", batch, ctx, F=4, **kw)
            row["order"] = with_order
            rows.append(row)
            print(rows[-1], flush=True)
    return rows


def _git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "HEAD"], text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def decode_grid() -> list[dict[str, Any]]:
    """Both models at batch {1,16,64,256} x context {512,2048,8192}, and one F = 4 view."""
    rows = []
    for model in MODELS:
        for batch in (1, 16, 64, 256):
            for ctx in (512, 2048, 8192):
                rows.append(bench_decode(model, batch, ctx))
                print(rows[-1], flush=True)
    rows.append(bench_decode("llama-3.1-8b", 256, 2048, F=4))  # strided layer view
    return rows


def prefill_grid() -> list[dict[str, Any]]:
    rows = []
    for model in MODELS:
        for length in (2048, 8192, 32768):
            rows.append(bench_prefill(model, length))
            print(rows[-1], flush=True)
    return rows


def tiles_tail(workload: str) -> list[dict[str, Any]]:
    """The tile variants over the run's last contexts, each through the graph's splits."""
    return [{"variant": f"{b}/{s}/{w}", **r}
            for b, s, w in TILES_VARIANTS
            for r in sharegpt_context_sweep(workload, SHAREGPT_TAIL_STEPS,
                                            (("graph", None, {"block_n": b, "num_stages": s,
                                                              "num_warps": w}),))]


def part_runners(workload: str) -> dict[str, Callable[[], dict[str, Any]]]:
    """Each `--parts` name: what it runs and the result keys it fills, in run order."""
    return {
        "decode": lambda: {"decode": decode_grid()},
        "prefill": lambda: {"prefill": prefill_grid()},
        "sweep": lambda: {"sweep": sweep()},
        "short_context": lambda: {"short_context": short_context_sweep()},
        "mixed_context": lambda: {"mixed_context": mixed_context_sweep()},
        "placement": lambda: {"placement": placement_sweep()},
        "grid_order": lambda: {"grid_order": grid_order_sweep()},
        "sharegpt_context": lambda: {"sharegpt_context": sharegpt_context_sweep(workload)},
        "stages": lambda: {"stages": stages_sweep(workload)},
        "argmax": lambda: {"argmax": argmax_sweep()},
        "rotary_kv_write": lambda: {"rotary_kv_write": rotary_kv_write_sweep()},
        "rms_norm": lambda: {"rms_norm": rms_norm_sweep()},
        "tiles_mha": lambda: {"tiles_mha": tiles_mha_sweep()},
        "tiles": lambda: {"tiles": stages_sweep(workload, TILES_VARIANTS),
                          "tiles_tail": tiles_tail(workload)},
        "sharegpt_tail": lambda: {"sharegpt_tail": sharegpt_context_sweep(
            workload, SHAREGPT_TAIL_STEPS, SHAREGPT_TAIL_VARIANTS)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="result JSON path")
    ap.add_argument("--commit", default=None, help="git commit (default: git rev-parse HEAD)")
    ap.add_argument("--sweep", action="store_true", help="also try kernel config variants")
    ap.add_argument("--parts", default="decode,prefill",
                    help="comma list of " + ", ".join(part_runners("")))
    ap.add_argument("--workload", default=".carry/sharegpt_llama31_1000.json",
                    help="prepared ShareGPT workload (sharegpt_context)")
    args = ap.parse_args()
    parts = set(args.parts.split(",")) | ({"sweep"} if args.sweep else set())
    runners = part_runners(args.workload)
    if parts - set(runners):
        ap.error(f"unknown parts: {', '.join(sorted(parts - set(runners)))}")
    result: dict[str, Any] = {
        "command": " ".join(["python"] + sys.argv),
        "git_commit": args.commit or _git_commit(),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__, "triton": triton.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "hbm_roofline_GBps": HBM_ROOFLINE_GBPS, "gemm_peak_tflops": GEMM_PEAK_TFLOPS,
        "measured_copy_GBps": round(copy_bandwidth_gbps(), 1),
        "dtype": "bfloat16", "block_size": BLOCK_SIZE,
    }
    for name, run in runners.items():
        if name in parts:
            result.update(run())
    Path(args.out).write_text(json.dumps(result, indent=1))
    _print_table(result)


def _print_table(r: dict[str, Any]) -> None:
    print(f"\n{r['gpu']}  copy {r['measured_copy_GBps']} GB/s  (roofline {HBM_ROOFLINE_GBPS})")
    print(f"{'model':14} {'B':>4} {'ctx':>5} {'F':>2} {'splits':>6} {'us':>8} {'GB/s':>7} {'%':>5}")
    parts = ("decode", "short_context", "mixed_context", "sharegpt_context", "grid_order")
    for d in [row for part in parts for row in r.get(part, [])]:
        print(f"{d['model']:14} {d['batch']:4} {d['context']:5} {d['F']:2} {d['num_splits']:6} "
              f"{d['time_us']:8} {d['GBps']:7} {d['pct_roofline']:5}")
    for p in r.get("prefill", []):
        print(f"prefill {p['model']:14} {p['tokens']:6} {p['time_ms']:8} ms {p['tflops']:6} "
              f"TFLOP/s ({p['pct_gemm_peak']}% of GEMM peak), sdpa {p['sdpa_flash_tflops']}")


if __name__ == "__main__":
    main()
