"""eLLM's layer-level overlap (issue 7 item 3), measured through the real runner: a dropped
prefix whose top H layer groups' KV waits in the host pool is copied in on the copy stream
while the lower G - H groups recompute it; how long the forward then waits for the copies
(the bubble), and what the split saves against recomputing every group.

One decode step per case: N requests with a dropped prefix of s tokens (context ctx) among
M plain decodes (context ctx). For each host-group count H (0 = recompute all), timed
(median of --reps after warm-up; CUDA events from before the copies are issued until both
streams are done, and wall time with a sync):
  overlap   the step as the engine runs it (copies on the copy stream, the forward waits
            per layer group; copied groups share --copy-window scratch sets, later copies
            issued once an earlier group's attention is done)
  serial    the same step with the copies on the compute stream before the forward
  compute   the same step with the copies left out: the truncated recompute and the
            forward alone (the scratch holds stale KV: timing only)
  copies    the step's prefix copies alone, on the copy stream
and derived: bubble = overlap - compute (how long the forward waited; its floor is zero
when the first copied group arrives before the forward reaches it), hidden = copies -
bubble, saved = serial - overlap, and vs_recompute_all = overlap(H) / overlap(H = 0).
With --calibration the cost model's price of each step is put beside it.

  python -m benchmarks.policies.bench_ellm_overlap --out results/policies/ellm_overlap_h200.json
      (GPU: llama-2-13b dummy, a few minutes)
  python -m benchmarks.policies.bench_ellm_overlap --model tiny-llama-gqa --device cpu --quick
      (CPU smoke run of the logic)
"""

from __future__ import annotations

import argparse
from typing import Any

from benchmarks.policies.bench_swap_overlap import (
    Timer,
    common_parser,
    model_geometry,
    ms,
    overlap_figures,
    parse_cases,
    set_up,
)

CASES = [(1, 128, 1024), (4, 256, 1024), (8, 256, 1024), (16, 256, 1024)]  # (N, s, ctx)
QUICK_CASES = [(2, 32, 64)]
HOST_GROUPS = [0, 3, 6, 9]  # clipped to G - 1
BLOCK_SIZE = 16


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = common_parser(__doc__, quick="one small case, 3 reps")
    p.add_argument("--cases", default=None,
                   help="N:s:ctx,... requests with a dropped prefix x prefix tokens x "
                        "context (default: " + ",".join(":".join(map(str, c)) for c in CASES)
                        + ")")
    p.add_argument("--host-groups", default=None,
                   help="comma-separated H values (default 0,3,6,9, clipped to G - 1)")
    p.add_argument("--decodes", type=int, default=64, help="M plain decodes beside them")
    p.add_argument("--copy-window", type=int, default=2,
                   help="copied groups in flight at once (the engine's --ellm-copy-window)")
    return p.parse_args(argv)


def build(args: argparse.Namespace, cases: list[tuple[int, int, int]]):
    """An eLLM engine whose pools hold the largest case: device = every row's full context
    (the dropped prefixes' columns are re-pointed at scratch each step), host = the copied
    groups' prefix blocks at the most host groups, scratch = that many sets (the engine's
    own sizing for H = G - 1)."""
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.kv.manager import cdiv

    f, groups, dtype = model_geometry(args)
    dev = max((n + args.decodes) * cdiv(c, BLOCK_SIZE) * groups for n, _, c in cases)
    host = max(n * (groups - 1) * cdiv(s, BLOCK_SIZE) for n, s, _ in cases)
    rows = max(n for n, _, _ in cases) + args.decodes
    prefix_tokens = max(n * s for n, s, _ in cases)
    batched = max(256, 1 << (rows + prefix_tokens - 1).bit_length())
    return LLMEngine.from_engine_args(EngineArgs(
        model=args.model, load_format="dummy", dtype=dtype, device=args.device,
        max_model_len=max(c for _, _, c in cases), max_num_seqs=max(rows, 8),
        max_num_batched_tokens=batched, block_size=BLOCK_SIZE, layers_per_block=f,
        num_gpu_blocks=dev, num_host_blocks=max(host, 1), kv_policy="ellm",
        ellm_host_groups=str(max(groups - 1, 0)), ellm_copy_window=args.copy_window,
        ellm_max_recompute_tokens=prefix_tokens, overlap_swap=True, piecewise_graphs=True))


def with_host_groups(runner, h: int) -> None:
    """The runner as an engine built with --ellm-host-groups h would run (the scratch was
    sized for the most groups, which covers fewer)."""
    runner.prefix_host_groups = h


def step_rows(engine, n: int, s: int, ctx: int, h: int, decodes: int, seed: int):
    """(rows installing every table, the decode step: n rows with a dropped s-token prefix
    whose top h groups' KV sits in host blocks 0.., then the plain decodes)."""
    from kvtier.core.plan import RecomputePrefix
    from kvtier.profiler.plans import PlanBuilder

    runner = engine.executor
    G, k = runner.num_groups, s // runner.block_size
    b = PlanBuilder(G, runner.block_size, engine.kv_manager.gpu.num_blocks,
                    runner.model_config.vocab_size, seed=seed)
    install, steady = b.decode_rows([ctx] * (n + decodes))
    host = iter(range(n * G * k))
    prefixes = []
    for sr in steady[:n]:
        blocks = tuple(tuple(next(host) for _ in range(k)) if g >= G - h else ()
                       for g in range(G))
        prefixes.append(RecomputePrefix(sr.request_id, b._tokens(s), blocks if h else ()))
    return install, steady, prefixes


def bench_case(engine, timer: Timer, n: int, s: int, ctx: int, h: int,
               args: argparse.Namespace, cost_models: dict | None) -> dict[str, Any]:
    from kvtier.core.plan import StepPlan
    from kvtier.costmodel.shape import StepShape
    from kvtier.profiler.plans import finish_plan
    from kvtier.runner.swap_copies import SwapCopies, make_streams

    runner = engine.executor
    G, F = runner.num_groups, runner.layers_per_block
    with_host_groups(runner, h)
    install, rows, prefixes = step_rows(engine, n, s, ctx, h, args.decodes,
                                        seed=n * 7919 + s + h)
    runner.execute(StepPlan(scheduled=install))
    step = StepPlan(scheduled=rows, items=prefixes)
    out: dict[str, Any] = {"prefix_requests": n, "prefix_tokens": s, "ctx": ctx,
                           "decodes": args.decodes, "host_groups": h, "num_groups": G}

    def streams(on: bool) -> None:
        runner.copies = SwapCopies(make_streams(runner.device, on), G, F)

    copy_blocks = runner.copy_blocks
    try:
        copies = runner.prepare_batch(rows, prefixes).prefix_copies  # host -> scratch block
        out["copy_blocks"] = len(copies)
        out["copy_gib"] = round(len(copies) * engine.block_bytes / 2**30, 4)
        streams(True)
        out["overlap"] = timer(lambda: runner.execute(step))
        runner.copy_blocks = lambda swap_out, swap_in, deferred=None: copy_blocks(
            swap_out, [], None)  # the step without its prefix copies: compute alone
        out["compute"] = timer(lambda: runner.execute(step))
        runner.copy_blocks = copy_blocks
        if copies:
            gpu, host = runner.gpu_kv, runner.host_kv

            def copies_alone() -> None:
                runner.copies.issue(gpu, host, [], copies)
                runner.copies.streams.join()

            out["copies"] = timer(copies_alone)
            streams(False)
            out["serial"] = timer(lambda: runner.execute(step))
    finally:
        runner.copy_blocks = copy_blocks
        streams(engine.config.overlap_swap)
        runner.execute(finish_plan(rows))
    out.update(overlap_figures(out["overlap"], out["compute"], out.get("serial"),
                               out.get("copies"), len(copies) * engine.block_bytes))
    if cost_models:
        shape = StepShape.from_plan(step)
        out["predicted"] = {name: round(cm.predict(shape).executor_s * 1e3, 4)
                            for name, cm in cost_models.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cases = parse_cases(args, CASES, QUICK_CASES)
    engine, timer, cost_models, built_s = set_up(args, build, cases)
    runner = engine.executor
    G = runner.num_groups
    hs = ([int(x) for x in args.host_groups.split(",")] if args.host_groups else HOST_GROUPS)
    hs = sorted({min(h, G - 1) for h in hs})
    print(f"engine built in {built_s:.1f} s: {engine.config.model}, G={G} "
          f"layer groups, {len(runner.recompute_scratch)} scratch blocks of "
          f"{engine.block_bytes / 2**20:.2f} MiB", flush=True)
    results = []
    for n, s, ctx in cases:
        base = None
        for h in hs:
            row = bench_case(engine, timer, n, s, ctx, h, args, cost_models)
            base = base or ms(row["overlap"])
            row["vs_recompute_all"] = round(ms(row["overlap"]) / base, 4)
            results.append(row)
            extra = (f", copies {ms(row['copies']):.2f} ms ({row['pcie_gb_s']} GB/s), serial "
                     f"{ms(row['serial']):.2f} ms, saved {row['saved_ms']:.2f} ms"
                     if "copies" in row else "")
            print(f"N={n:>3} s={s:>4} ctx={ctx:>5} H={h}: overlap {ms(row['overlap']):.2f} ms, "
                  f"compute {ms(row['compute']):.2f} ms, bubble {row['bubble_ms']:.2f} ms"
                  f"{extra}; x{row['vs_recompute_all']:.3f} of recomputing all", flush=True)
    with_host_groups(runner, G - 1)
    if args.out:
        from benchmarks.common import write_result

        write_result(args.out, {
            "benchmark": "ellm_overlap", "model": args.model, "device": args.device,
            "layers_per_block": runner.layers_per_block, "num_groups": G,
            "copy_window": args.copy_window, "block_bytes": engine.block_bytes,
            "reps": args.reps, "warmup": args.warmup, "calibration": args.calibration,
            "cases": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
