"""Layer-level overlap of swap-ins (issue 7 item 3): how much of a step's PCIe copy time the
forward hides, measured through the real runner.

One step per case: N requests swapped back in (their whole KV, ctx tokens each, host ->
device, layer group by layer group) and decoding in the same step, beside M running decodes
at context `--decode-ctx`. Timed variants (median of --reps after warm-up; CUDA events from
before the copies are issued until both streams are done, and wall time with a sync):
  step_overlap      the step with overlap on (copy stream, waits per layer group; decode
                    steps with swap-ins replay the piecewise graphs)
  step_serial       the step with overlap off (copies on the compute stream, then the
                    forward: a full-graph replay)
  copies            the swap-ins alone (no forward)
  forward_piecewise the same step's forward alone (KV already on the device), piecewise
  forward_graph     the same, full-graph replay (what step_serial's forward runs)
and derived: bubble = step_overlap - forward_piecewise (how long the forward waited for
copies; the floor is group 0's share of the copies, copies / G), hidden = copies - bubble,
saved = step_serial - step_overlap. With --calibration the cost model's predictions of both
steps (and its bubble) are put beside them.

  python -m benchmarks.policies.bench_swap_overlap --model llama-2-13b \\
      --out results/policies/swap_overlap_h200_13b.json          (GPU; a few minutes)
  python -m benchmarks.policies.bench_swap_overlap --model tiny-llama-gqa --device cpu --quick
                                                                     (CPU smoke run of the logic)
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

CASES = [(8, 1024), (16, 1024), (32, 1024), (64, 1024), (8, 4096), (16, 4096)]  # (N, ctx)
QUICK_CASES = [(4, 64), (8, 64)]
BLOCK_SIZE = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common_parser(__doc__, quick="two small cases, 3 reps")
    p.add_argument("--cases", default=None,
                   help="N:ctx,N:ctx,... swapped-in requests x tokens (default: "
                        + ",".join(f"{n}:{c}" for n, c in CASES) + ")")
    p.add_argument("--decodes", type=int, default=32, help="M running decodes beside them")
    p.add_argument("--decode-ctx", type=int, default=1024, help="context of the M decodes")
    return p.parse_args(argv)


def common_parser(doc: str | None, quick: str) -> argparse.ArgumentParser:
    """A parser with the options the copy-overlap benchmarks share (this one and
    bench_ellm_overlap)."""
    p = argparse.ArgumentParser(description=(doc or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-2-13b",
                   help="dummy preset (llama-2-13b, llama-3.1-8b, tiny-llama-gqa) or HF dir")
    p.add_argument("--device", default="cuda", help="cuda | cpu (cpu: a smoke run only)")
    p.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--layers-per-block", type=int, default=4, help="F: layers per KV block")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--calibration", default=None, help="calibration JSON for predictions")
    p.add_argument("--hardware", default="h200", help="the cost model's hardware profile")
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--out", default=None, help="result JSON (benchmarks/common.write_result)")
    return p


def parse_cases(args: argparse.Namespace, cases: list, quick_cases: list) -> list[tuple]:
    """--cases "a:b,c:d" as int tuples; else the quick or the full default list."""
    if args.cases:
        return [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")]
    return quick_cases if args.quick else cases


def model_geometry(args: argparse.Namespace) -> tuple[int, int, str]:
    """(layers per block, layer groups, dtype) of the engine a benchmark builds."""
    from kvtier.kv.manager import cdiv
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config(args.model, "dummy")
    f = min(args.layers_per_block, mc.num_layers)
    dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    return f, cdiv(mc.num_layers, f), dtype


def build(args: argparse.Namespace, cases: list[tuple[int, int]]):
    """An engine whose pools hold the largest case: device = M decodes + N swapped-in
    requests, host = the N requests. Piecewise graphs up to a small token count (a step has
    N + M decode rows), so capture stays short."""
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.kv.manager import cdiv

    f, groups, dtype = model_geometry(args)
    blocks = lambda tokens: cdiv(tokens, BLOCK_SIZE) * groups  # noqa: E731
    host = max(n * blocks(c) for n, c in cases)
    dev = max(n * blocks(c) for n, c in cases) + args.decodes * blocks(args.decode_ctx)
    max_len = max([c for _, c in cases] + [args.decode_ctx])  # a row ends at its ctx
    rows = max(n for n, _ in cases) + args.decodes
    batched = max(256, 1 << (rows - 1).bit_length())
    return LLMEngine.from_engine_args(EngineArgs(
        model=args.model, load_format="dummy", dtype=dtype, device=args.device,
        max_model_len=max_len, max_num_seqs=max(rows, 8), max_num_batched_tokens=batched,
        block_size=BLOCK_SIZE, layers_per_block=f, num_gpu_blocks=dev, num_host_blocks=host,
        kv_policy="swap", overlap_swap=True, piecewise_graphs=True))


class Timer:
    """Median seconds of a call until both streams are done: CUDA events around it (the
    copy stream joined before the end event) and wall time; perf_counter alone on CPU."""

    def __init__(self, runner, reps: int, warmup: int):
        self.runner, self.reps, self.warmup = runner, reps, warmup
        self.cuda = runner.device.type == "cuda"

    def __call__(self, fn) -> dict[str, float]:
        import torch

        for _ in range(self.warmup):
            fn()
        self._sync()
        gpu, wall = [], []
        for _ in range(self.reps):
            if self.cuda:
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
            t0 = time.perf_counter()
            fn()
            self.runner.copies.streams.join()
            if self.cuda:
                end.record()
                end.synchronize()
                gpu.append(start.elapsed_time(end) / 1e3)
            self._sync()
            wall.append(time.perf_counter() - t0)
        out = {"wall_ms": round(1e3 * statistics.median(wall), 4)}
        if gpu:
            out["gpu_ms"] = round(1e3 * statistics.median(gpu), 4)
        return out

    def _sync(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.synchronize(self.runner.device)


def ms(row: dict[str, float]) -> float:
    return row.get("gpu_ms", row["wall_ms"])


def overlap_figures(overlap: dict, forward: dict, serial: dict | None = None,
                    copies: dict | None = None, copied_bytes: int = 0) -> dict[str, float]:
    """What the timed variants of a step say: bubble = overlap - forward alone (how long
    the forward waited for copies); with copies, hidden = copies - bubble, saved = serial -
    overlap, and the copies' rate."""
    bubble = ms(overlap) - ms(forward)
    out = {"bubble_ms": round(bubble, 4)}
    if copies is not None and serial is not None:
        out["hidden_ms"] = round(ms(copies) - bubble, 4)
        out["saved_ms"] = round(ms(serial) - ms(overlap), 4)
        out["pcie_gb_s"] = round(copied_bytes / (ms(copies) / 1e3) / 1e9, 2)
    return out


def bench_case(engine, timer: Timer, n: int, ctx: int, args: argparse.Namespace,
               cost_models: dict | None) -> dict[str, Any]:
    from kvtier.core.plan import BlockCopy, ScheduledRequest, StepPlan
    from kvtier.costmodel.shape import StepShape
    from kvtier.profiler.plans import GREEDY, PlanBuilder, finish_plan
    from kvtier.runner.swap_copies import SwapCopies, make_streams

    runner = engine.executor
    b = PlanBuilder(runner.num_groups, runner.block_size, engine.kv_manager.gpu.num_blocks,
                    runner.model_config.vocab_size, seed=n * 100003 + ctx)
    install, steady = b.decode_rows([args.decode_ctx] * args.decodes)
    if install:
        runner.execute(StepPlan(scheduled=install))
    resumed, swap_in, host_next = [], [], 0
    for i in range(n):
        blocks = b._blocks(ctx)  # device blocks per group
        for g, ids in enumerate(blocks):
            for d in ids:
                swap_in.append(BlockCopy(src=host_next, dst=d, group=g))
                host_next += 1
        resumed.append(ScheduledRequest(
            request_id=f"__swapped{i}", token_ids=[1 + i], start_pos=ctx - 1,
            new_block_ids=blocks, reset_blocks=True, sample=True, sampling_params=GREEDY,
            num_output_tokens=1))
    rows = steady + resumed
    step = StepPlan(scheduled=rows, swap_in=swap_in)
    fwd = StepPlan(scheduled=rows)
    copies_only = StepPlan(scheduled=[], swap_in=swap_in)
    G, F = runner.num_groups, runner.layers_per_block

    def with_overlap(on: bool) -> None:
        runner.copies = SwapCopies(make_streams(runner.device, on), G, F)

    out: dict[str, Any] = {"swapped_requests": n, "ctx": ctx, "decodes": args.decodes,
                           "decode_ctx": args.decode_ctx, "swap_in_blocks": len(swap_in),
                           "swap_in_gib": round(len(swap_in) * engine.block_bytes / 2**30, 3)}
    try:
        with_overlap(True)
        out["step_overlap"] = timer(lambda: runner.execute(step))
        out["copies"] = timer(lambda: runner.execute(copies_only))
        graphs = runner.graphs
        runner.graphs = None  # the forward through the pieces, as step_overlap runs it
        try:
            out["forward_piecewise"] = timer(lambda: runner.execute(fwd))
        finally:
            runner.graphs = graphs
        out["forward_graph"] = timer(lambda: runner.execute(fwd))
        with_overlap(False)
        out["step_serial"] = timer(lambda: runner.execute(step))
    finally:
        with_overlap(engine.config.overlap_swap)
        runner.execute(finish_plan(rows))
    out.update(overlap_figures(out["step_overlap"], out["forward_piecewise"],
                               out["step_serial"], out["copies"],
                               len(swap_in) * engine.block_bytes))
    out["bubble_floor_ms"] = round(ms(out["copies"]) / G, 4)  # group 0's copies
    if cost_models:
        shape = StepShape.from_plan(step)
        pred: dict[str, Any] = {}
        for name, cm in cost_models.items():
            cost = cm.predict(shape)
            pred[name] = {"step_ms": round(cost.executor_s * 1e3, 4),
                          "copies_ms": round(cost.parts.get("copies", 0.0) * 1e3, 4),
                          "piecewise": cost.piecewise, "graph": cost.graph}
        out["predicted"] = pred
    return out


def make_cost_models(engine, args: argparse.Namespace) -> dict | None:
    """{"overlap": ..., "serial": ...}: the engine's own cost-model settings, copies
    overlapped per layer group or not."""
    if not args.calibration:
        return None
    from dataclasses import replace

    from kvtier.costmodel.calibration import Calibration
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel
    from kvtier.policies import system_cost_config

    calib = Calibration.load(args.calibration)
    base = system_cost_config(engine.config, engine.block_bytes)
    hw = get_hardware(args.hardware)
    return {name: CostModel(engine.config.model_config, hw, calib,
                            replace(base, overlap_swap=on))
            for name, on in (("overlap", True), ("serial", False))}


def set_up(args: argparse.Namespace, build_engine, cases: list):
    """(engine, timer, cost models, seconds to build) of a copy-overlap benchmark run; the
    device pool filled with random KV (attention is never timed on zeros)."""
    if args.quick:
        args.reps = min(args.reps, 3)
    t0 = time.perf_counter()
    engine = build_engine(args, cases)
    built_s = time.perf_counter() - t0
    runner = engine.executor
    if runner.device.type == "cuda":
        runner.gpu_kv.normal_()
    return engine, Timer(runner, args.reps, args.warmup), make_cost_models(engine, args), built_s


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = parse_cases(args, CASES, QUICK_CASES)
    engine, timer, cost_models, built_s = set_up(args, build, cases)
    print(f"engine built in {built_s:.1f} s: {engine.config.model}, "
          f"{engine.kv_manager.gpu.num_blocks} device + {engine.kv_manager.host.num_blocks} "
          f"host blocks of {engine.block_bytes / 2**20:.2f} MiB, "
          f"G={engine.executor.num_groups} layer groups", flush=True)
    runner = engine.executor
    results = []
    for n, ctx in cases:
        row = bench_case(engine, timer, n, ctx, args, cost_models)
        results.append(row)
        print(f"N={n:>3} ctx={ctx:>5} ({row['swap_in_gib']:.2f} GiB): "
              f"overlap {ms(row['step_overlap']):.2f} ms, serial {ms(row['step_serial']):.2f} "
              f"ms, copies {ms(row['copies']):.2f} ms ({row['pcie_gb_s']} GB/s), forward "
              f"piecewise {ms(row['forward_piecewise']):.2f} / graph "
              f"{ms(row['forward_graph']):.2f} ms; bubble {row['bubble_ms']:.2f} ms "
              f"(floor {row['bubble_floor_ms']:.2f}), saved {row['saved_ms']:.2f} ms",
              flush=True)
    if args.out:
        from benchmarks.common import write_result

        write_result(args.out, {
            "benchmark": "swap_overlap", "model": args.model, "device": args.device,
            "layers_per_block": runner.layers_per_block, "num_groups": runner.num_groups,
            "block_bytes": engine.block_bytes, "reps": args.reps, "warmup": args.warmup,
            "calibration": args.calibration, "cases": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
