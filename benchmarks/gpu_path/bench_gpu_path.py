"""The GPU path against the H200's measured ceilings (issue 3):

  decode   step time of b requests at context c vs the HBM roofline
           (weights + KV read + KV written, at 4.24 TB/s), CUDA graphs on;
  prefill  one prompt of n tokens vs the bf16 GEMM peak (761 TFLOP/s);
  layers   the effect of F (layers per KV block) on decode step time;
  host     CPU time per decode step (schedule + inputs + update) at 256 running requests,
           synchronous and with async scheduling;
  decode_targets  the issue's two decode shapes, runner steps and whole engine steps;
  kv_contents     those shapes' runner steps over a zeroed pool vs one holding values;
  layers_engine   F = 4 vs F = L on whole engine steps (async scheduling);
  target_engine   the 256 x 2048 target on whole engine steps (async scheduling) only;
  layers_engine_target  F = 4 then F = L on engine steps at 256 x 2048 only;
  step_kernels    the 256 x 2048 step's device time by kernel kind (profiler).

Steps are driven through the real runner (`ModelRunner.execute` on a StepPlan), so what is
timed is what the engine runs. Usage (GPU):
  python -m benchmarks.gpu_path.bench_gpu_path --out results/gpu_path/gpu_path_h200.json
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import os
import pstats
import statistics
import time
from dataclasses import replace

import torch

from benchmarks.common import (
    H200_BF16_FLOPS,
    H200_HBM_BYTES_PER_S,
    median_replay_s,
    monitored,
    write_result,
)
from kvtier.config import ModelConfig
from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import SamplingParams

# The decode sweep's pool per model: llama-2-13b's KV is 800 KiB a token (MHA), so its
# 64 x 2048 and 16 x 8192 shapes need 100 GiB, which fits beside its 24 GiB of weights.
DECODE_POOL_GIB = {"llama-2-13b": 102.0}

GREEDY = SamplingParams(temperature=0.0, max_tokens=1 << 20, ignore_eos=True, detokenize=False)
GiB = 1 << 30


def release(engine: LLMEngine) -> None:
    """Drop an engine's GPU memory (the next `make_engine` returns the allocator's cache)."""
    engine.close()


def make_engine(model: str, max_len: int, max_seqs: int, kv_gb: float, layers_per_block: int,
                eager: bool = False, max_batched: int = 8192,
                piecewise: bool = False, async_scheduling: bool = False) -> LLMEngine:
    """Decode-only and single-prompt steps: piecewise graphs (steps with prefill rows beside
    decodes) would only add capture time, so they are off unless asked for. Starts by
    returning the allocator's cached segments: a previous engine's pool freed only when its
    caller's frame ended stays cached, and the new engine's weights would be carved out of
    it, leaving too little contiguous memory for the new pool (seen on the H200: 65 GiB
    reserved but unallocated, the second 80 GiB pool out of memory)."""
    gc.collect()
    torch.cuda.empty_cache()
    return LLMEngine.from_engine_args(EngineArgs(
        model=model, load_format="dummy", dtype="bfloat16", max_model_len=max_len,
        max_num_seqs=max_seqs, kv_cache_gb=kv_gb, swap_space=0.01,
        layers_per_block=layers_per_block, enforce_eager=eager,
        max_num_batched_tokens=max_batched, piecewise_graphs=piecewise,
        async_scheduling=async_scheduling))


def decode_plans(engine: LLMEngine, batch: int, context: int) -> tuple[StepPlan, StepPlan]:
    """A first plan that installs b distinct block tables, then a steady decode plan."""
    runner = engine.executor
    g, bs = runner.num_groups, runner.block_size
    nb = -(-context // bs)
    first, steady, nxt = [], [], 0
    for i in range(batch):
        blocks = tuple(tuple(range(nxt + k * nb, nxt + (k + 1) * nb)) for k in range(g))
        nxt += g * nb
        common = dict(request_id=f"d{i}", token_ids=[1 + i % 1000], start_pos=context - 1,
                      sample=True, sampling_params=GREEDY, num_output_tokens=1)
        first.append(ScheduledRequest(new_block_ids=blocks, reset_blocks=True, **common))
        steady.append(ScheduledRequest(new_block_ids=((),) * g, reset_blocks=False, **common))
    assert nxt <= engine.kv_manager.gpu.num_blocks, "pool too small for this shape"
    return StepPlan(scheduled=first), StepPlan(scheduled=steady)


def time_steps(runner, plan: StepPlan, iters: int) -> dict[str, float]:
    """Median wall time of whole steps (host + device, synchronised by sampling)."""
    for _ in range(3):
        runner.execute(plan)
    torch.cuda.synchronize()
    walls = []
    for _ in range(iters):
        t0 = time.perf_counter()
        runner.execute(plan)
        walls.append(time.perf_counter() - t0)
    return {"median_s": statistics.median(walls), "min_s": min(walls)}


def weight_bytes(mc: ModelConfig) -> int:
    """bf16 bytes of the weights a forward reads (and multiplies: 2 FLOPs each per token)."""
    weights = mc.num_params() * 2
    if not mc.tie_word_embeddings:
        weights -= mc.vocab_size * mc.hidden_size * 2  # the embedding table is gathered, not read
    return weights


def decode_bytes(mc: ModelConfig, batch: int, context: int) -> tuple[int, int]:
    """(weight bytes read, KV bytes read) of one decode step."""
    return weight_bytes(mc), batch * context * mc.kv_bytes_per_token(2)


def roofline(weight_bytes: int, kv_bytes: int, batch: int) -> tuple[float, float]:
    """(HBM-only roofline, per-operator roofline). The second takes each operator's larger
    of bytes/bandwidth and FLOPs/peak: at batch 256 the linear layers (2 FLOPs per weight per
    token) sit past the H200's ridge (~180 FLOP/byte) and are compute-bound."""
    hbm = (weight_bytes + kv_bytes) / H200_HBM_BYTES_PER_S
    linear = max(weight_bytes / H200_HBM_BYTES_PER_S, batch * weight_bytes / H200_BF16_FLOPS)
    return hbm, linear + kv_bytes / H200_HBM_BYTES_PER_S


def fill_kv(engine: LLMEngine, values: str) -> None:
    """The pool's contents under a runner-driven decode, whose plans attend to KV no prefill
    wrote: "random" stands for what a served model writes, "zeros" is a fresh pool. They
    differ on the H200: reading zeros draws less power, so under the board's 700 W cap the
    clocks stay higher (part `kv_contents`). In place, as bench_swap_overlap fills its pool."""
    kv = engine.executor.gpu_kv
    assert kv is not None
    kv.normal_() if values == "random" else kv.zero_()


def run_decode(model: str, batches: list[int], contexts: list[int], kv_gb: float, F: int,
               max_seqs: int | None = None, kv_values: tuple[str, ...] = ("random",)
               ) -> list[dict]:
    """A row per (context, batch, pool contents): `kv_values` lists `fill_kv` contents to
    time in turn on the same engine (a same-call A/B when it alternates)."""
    rows = []
    engine = make_engine(model, max(contexts) + 16, max_seqs or max(batches), kv_gb, F)
    pool_tokens = engine.kv_manager.gpu.num_blocks // engine.executor.num_groups * 16
    for c in contexts:
        for b in batches:
            row = {"model": model, "batch": b, "context": c, "layers_per_block": F}
            if b * (-(-c // 16) * 16) > pool_tokens:
                rows.append({**row, "skipped": f"KV of {b}x{c} tokens exceeds the pool"})
                continue
            for values in kv_values:
                fill_kv(engine, values)
                rows.append({**row, "kv_values": values, **decode_row(engine, b, c)})
                print(rows[-1], flush=True)
    release(engine)
    return rows


def decode_row(engine: LLMEngine, b: int, c: int) -> dict:
    """Runner steps of b requests at context c (sync wall and graph device time) against
    the HBM and per-operator rooflines."""
    first, steady = decode_plans(engine, b, c)
    engine.executor.execute(first)
    t: dict = time_steps(engine.executor, steady, iters=20)
    graphs = engine.executor.graphs
    if graphs is not None and graphs.padded_size(b) is not None:
        # The same step's device time alone: the step wall above adds the host work
        # that a synchronous step does not overlap (async scheduling hides it).
        graph = graphs.graphs[graphs.padded_size(b)]
        t["device_s"], t["gpu"] = monitored(lambda: median_replay_s(graph, 30))
    wb, kvb = decode_bytes(engine.model_config, b, c)
    hbm, per_op = roofline(wb, kvb, b)
    engine.executor.execute(StepPlan(scheduled=[], finished_ids=[
        s.request_id for s in steady.scheduled]))
    return {**t, "weight_bytes": wb, "kv_bytes": kvb, "roofline_s": hbm,
            "fraction_of_roofline": hbm / t["median_s"],
            **({"device_fraction_of_roofline": hbm / t["device_s"]} if "device_s" in t else {}),
            "per_operator_roofline_s": per_op,
            "fraction_of_per_operator_roofline": per_op / t["median_s"]}


KERNEL_KINDS = (("attention", ("_decode_split", "_reduce_splits")),
                ("gemm", ("nvjet", "gemm", "cutlass", "splitKreduce")))


def kernel_kind(name: str) -> str:
    """A kernel's group in a step's breakdown: attention, GEMMs (cuBLAS), else its own name."""
    for kind, marks in KERNEL_KINDS:
        if any(m in name for m in marks):
            return kind
    return name[:60]


def decode_step_engine(model: str, batch: int, context: int, kv_gb: float) -> LLMEngine:
    """An engine (F = 4) whose decode graphs read `batch` requests at `context` tokens over a
    pool of random values: the block tables installed by one step, so replays need nothing
    more."""
    engine = make_engine(model, context + 16, batch, kv_gb, 4)
    fill_kv(engine, "random")
    first, _ = decode_plans(engine, batch, context)
    engine.executor.execute(first)
    return engine


def run_step_kernels(model: str, batch: int, context: int, kv_gb: float, reps: int = 20
                     ) -> dict:
    """Where one decode step's device time goes: the graph of b requests at context c
    replayed `reps` times under torch.profiler, its kernels grouped (`kernel_kind`), the
    attention's KV bandwidth and the GEMMs' FLOP rate at the clock the board held."""
    engine = decode_step_engine(model, batch, context, kv_gb)
    graphs = engine.executor.graphs
    graph = graphs.graphs[graphs.padded_size(batch)]
    for _ in range(5):
        graph.replay()
    torch.cuda.synchronize()

    def replays() -> None:
        for _ in range(reps):
            graph.replay()
        torch.cuda.synchronize()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        _, gpu = monitored(replays)
    by_kind: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernel_kind(e.name)
            by_kind[k] = by_kind.get(k, 0.0) + e.time_range.elapsed_us() / reps
    mc = engine.model_config
    wb, kvb = decode_bytes(mc, batch, context)
    release(engine)
    total = sum(by_kind.values())
    att, gemm = by_kind.get("attention", 0.0), by_kind.get("gemm", 0.0)
    return {"model": model, "batch": batch, "context": context, "gpu": gpu,
            "kernel_us_per_step": total,
            "by_kind_us": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
            "attention_kv_bytes_per_s": kvb / (att * 1e-6) if att else None,
            "gemm_flops_per_s": 2 * batch * wb / 2 / (gemm * 1e-6) if gemm else None}


def prefill_linear_flops(mc: ModelConfig, n: int) -> float:
    """FLOPs of the linear layers of one n-token prompt as the runner computes them: every
    layer's QKV projection over all n rows, the rest of the layers (O projection and MLP)
    over all n rows except in the last layer, which runs them for the sampled row only."""
    qkv = mc.hidden_size * (mc.q_size + 2 * mc.kv_size)
    rest = mc.q_size * mc.hidden_size + 3 * mc.hidden_size * mc.intermediate_size
    return 2.0 * (mc.num_layers * n * qkv + ((mc.num_layers - 1) * n + 1) * rest)


def run_prefill(model: str, lengths: list[int], kv_gb: float) -> list[dict]:
    engine = make_engine(model, max(lengths) + 16, 4, kv_gb, 4, max_batched=max(lengths))
    mc = engine.model_config
    rows = []
    for n in lengths:
        g = engine.executor.num_groups
        nb = -(-n // 16)
        blocks = tuple(tuple(range(k * nb, (k + 1) * nb)) for k in range(g))
        plan = StepPlan(scheduled=[ScheduledRequest(
            request_id="p", token_ids=[7] * n, start_pos=0, new_block_ids=blocks,
            reset_blocks=True, sample=True, sampling_params=GREEDY, num_output_tokens=0)])
        t = time_steps(engine.executor, plan, iters=5)
        linear = prefill_linear_flops(mc, n)
        attn = 2 * 2 * mc.num_layers * mc.q_size * n * n / 2  # causal QK^T and PV
        logits = 2 * mc.hidden_size * mc.vocab_size
        flops = linear + attn + logits
        rows.append({"model": model, "tokens": n, **t, "flops": flops,
                     "tflops": flops / t["median_s"] / 1e12,
                     "fraction_of_gemm_peak": flops / t["median_s"] / H200_BF16_FLOPS})
        print(rows[-1], flush=True)
    release(engine)
    return rows


def step_phases(engine: LLMEngine, iters: int) -> dict[str, float]:
    """Median ms of each part of a synchronous step, timed by wrapping the engine's own
    calls for `iters` more steps (a few µs of wrapper each): scheduling, the runner's launch
    (host batch, uploads, graph replay and sampling issued), the wait for the sampled tokens
    (the GPU's remaining work), the scheduler's update and the engine's outputs."""
    times: dict[str, list[float]] = {}
    runner, sched = engine.executor, engine.scheduler
    patched: list = []

    def wrap(obj, name: str, label: str, on_result=None) -> None:
        fn = getattr(obj, name)

        def timed(*a, **k):
            t0 = time.perf_counter()
            out = fn(*a, **k)
            times.setdefault(label, []).append(time.perf_counter() - t0)
            return on_result(out) if on_result else out
        setattr(obj, name, timed)

    def time_result(pending):
        wrap(pending, "result", "wait_tokens")
        return pending

    for obj, name, *how in ((sched, "schedule", "schedule"),
                            (runner, "launch", "launch", time_result),
                            (sched, "update", "update"), (engine, "make_outputs", "outputs"),
                            (runner, "prepare_batch", "launch.host_batch")):
        wrap(obj, name, *how)
        patched.append((obj, name))
    try:
        for _ in range(iters):
            engine.step()
    finally:
        for obj, name in patched:
            delattr(obj, name)  # the class's method again
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def step_profile(engine: LLMEngine, iters: int, top: int = 30) -> list[dict]:
    """Where a step's host time goes: cProfile over `iters` more steps, the `top` functions
    by own time, per step (the profiler's hooks inflate Python calls; read it for shares)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        engine.step()
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, ncalls, tottime, cumtime, _)}
    rows = sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]
    return [{"function": f"{os.path.relpath(f) if f.startswith('/') else f}:{line}({name})",
             "calls_per_step": n / iters, "own_ms_per_step": 1e3 * own / iters,
             "cum_ms_per_step": 1e3 * cum / iters}
            for (f, line, name), (_, n, own, cum, _) in rows]


def engine_decode_steps(engine: LLMEngine, num_requests: int, context: int,
                        kind: str = "final_only", profile: bool = False) -> dict:
    """Steady decode steps of the whole engine (`engine.step()`: schedule, inputs, graph
    replay, sampling, update, outputs) over `num_requests` prompts of `context` tokens,
    against the device time of the same step's graph replayed alone. Synchronous steps
    expose their host work; with async scheduling the host prepares step N+1 while the GPU
    runs step N, so only what the GPU waits for shows."""
    params = replace(GREEDY, output_kind=kind)
    ids = [f"{kind}{num_requests}_{i}" for i in range(num_requests)]  # fresh per call
    for i, rid in enumerate(ids):
        engine.add_request(rid, [1 + (i * 7 + k) % 30000 for k in range(context)], params)
    while engine.get_stats().num_waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    torch.cuda.synchronize()
    walls = []
    first = statistics.mean(r.num_tokens for r in engine.scheduler.running)
    for _ in range(30):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    mean_context = (first + statistics.mean(r.num_tokens for r in engine.scheduler.running)) / 2
    graph = engine.executor.graphs.graphs[engine.executor.graphs.padded_size(num_requests)]
    dev, gpu = monitored(lambda: median_replay_s(graph, 30))
    step = statistics.median(walls)
    row = {"mean_context": mean_context, "step_ms": step * 1e3, "device_ms": dev * 1e3,
           "graph_gpu": gpu,
           "host_overhead_ms": (step - dev) * 1e3, "step_ms_all": [w * 1e3 for w in walls],
           "phases_ms": step_phases(engine, 30)}
    if profile:
        row["profile"] = step_profile(engine, 30)
    engine.abort_request(ids)
    return row


def run_host_overhead(model: str, num_requests: int, context: int, kv_gb: float,
                      async_scheduling: bool = False) -> dict:
    """Host time of a decode step: a whole `engine.step()` minus the device time of the same
    step's graph replay, for offline generation (final outputs only) and streaming."""
    engine = make_engine(model, context + 256, num_requests, kv_gb, 4,
                         async_scheduling=async_scheduling)
    rows = {kind: engine_decode_steps(engine, num_requests, context, kind,
                                      profile=not async_scheduling)
            for kind in ("final_only", "cumulative")}  # offline generate / streaming server
    release(engine)
    return {"model": model, "running_requests": num_requests, "context": context,
            "async_scheduling": async_scheduling, **rows}


def run_engine_decode(model: str, batches: list[int], context: int, kv_gb: float,
                      async_scheduling: bool, F: int = 4) -> list[dict]:
    """Decode shapes measured on the whole engine's steps (offline generation), one engine
    for all `batches`."""
    engine = make_engine(model, context + 256, max(batches), kv_gb, F,
                         async_scheduling=async_scheduling)
    rows = []
    for batch in batches:
        row = engine_decode_steps(engine, batch, context)
        wb, kvb = decode_bytes(engine.model_config, batch, round(row["mean_context"]))
        hbm, _ = roofline(wb, kvb, batch)
        rows.append({"model": model, "batch": batch, "context": context,
                     "layers_per_block": F, "async_scheduling": async_scheduling, **row,
                     "roofline_ms": hbm * 1e3, "fraction_of_roofline": hbm / (row["step_ms"] / 1e3),
                     "device_fraction_of_roofline": hbm / (row["device_ms"] / 1e3)})
        print(rows[-1]["layers_per_block"], batch, rows[-1]["step_ms"], flush=True)
    release(engine)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--parts", default="host,decode,prefill,layers")
    ap.add_argument("--kv-gb", type=float, default=80.0)
    args = ap.parse_args()
    # llama-2-13b's config says 4096 positions; the 8192 context is a bandwidth
    # shape, so allow it (the dummy weights have no trained length to respect).
    os.environ["KVTIER_ALLOW_LONG_MAX_MODEL_LEN"] = "1"
    result: dict = {"ceilings": {"hbm_bytes_per_s": H200_HBM_BYTES_PER_S,
                                 "bf16_flops": H200_BF16_FLOPS}}
    for part in args.parts.split(","):
        if part == "host":
            result["host_overhead"] = run_host_overhead("llama-3.1-8b", 256, 512, 40.0)
            print(result["host_overhead"], flush=True)
            result["host_overhead_async"] = run_host_overhead("llama-3.1-8b", 256, 512, 40.0,
                                                              async_scheduling=True)
            print(result["host_overhead_async"], flush=True)
        elif part == "decode":
            result["decode"] = [
                r for m in ("llama-3.1-8b", "llama-2-13b")
                for r in run_decode(m, [1, 16, 64, 256], [512, 2048, 8192],
                                    DECODE_POOL_GIB.get(m, args.kv_gb), 4)]
        elif part == "decode_small":  # llama-3.1-8b's small batches, where latency is
            result["decode_small"] = run_decode("llama-3.1-8b", [1, 16], [512, 2048, 8192],
                                                args.kv_gb, 4)
        elif part == "decode_targets":  # the two decode targets only
            result["decode_targets"] = (
                run_decode("llama-3.1-8b", [256], [2048], args.kv_gb, 4)
                + run_decode("llama-3.1-8b", [16], [8192], args.kv_gb, 4))
            # The same two shapes as whole engine steps, synchronous and async scheduling.
            result["decode_targets_engine"] = [
                r for b, c in ((256, 2048), (16, 8192)) for a in (False, True)
                for r in run_engine_decode("llama-3.1-8b", [b], c, args.kv_gb, a)]
        elif part == "target_engine":  # the 256 x 2048 target on engine steps (async) only
            result["target_engine"] = run_engine_decode("llama-3.1-8b", [256], 2048,
                                                        args.kv_gb, True)
        elif part == "layers_engine_target":  # the same at 256 rows only, once each
            result["layers_per_block_engine"] = [
                r for F in (4, 32)
                for r in run_engine_decode("llama-3.1-8b", [256], 2048, 70.0, True, F)]
        elif part == "step_kernels":  # the 256 x 2048 target step's kernels by kind
            result["step_kernels"] = run_step_kernels("llama-3.1-8b", 256, 2048, args.kv_gb)
            print(result["step_kernels"], flush=True)
        elif part == "kv_contents":  # the decode targets over a zeroed vs a filled pool
            result["kv_contents"] = [
                r for b, c in ((256, 2048), (16, 8192))
                for r in run_decode("llama-3.1-8b", [b], [c], args.kv_gb, 4,
                                    kv_values=("zeros", "random") * 2)]
        elif part == "prefill":
            result["prefill"] = run_prefill("llama-3.1-8b", [2048, 8192, 32768], 20.0)
        elif part == "layers":
            # F = 32 is vLLM's layout (all layers in one block) for this 32-layer model.
            result["layers_per_block"] = [
                r for F in (1, 2, 4, 8, 32)
                for r in run_decode("llama-3.1-8b", [64, 256], [2048], 70.0, F)]
        elif part == "layers_engine":
            # F = 4 against F = L on whole engine steps with async scheduling, where the
            # host's per-group work (block tables, slots: 32/F groups) hides behind the GPU
            # as it does in serving; alternating, twice.
            result["layers_per_block_engine"] = [
                r for F in (4, 32, 4, 32)
                for r in run_engine_decode("llama-3.1-8b", [64, 256], 2048, 70.0, True, F)]
        write_result(args.out, result)  # after every part: a later failure keeps the rest


if __name__ == "__main__":
    main()
