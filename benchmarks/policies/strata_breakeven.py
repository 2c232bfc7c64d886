"""Where the host tier stops paying, by the cost model: loading a cached prefix of L tokens
from the host tier against computing it again, for L = 16 ... 32768, on a hardware profile.

  load       the prices the simulator charges a host hit (kvtier/offload/items.py): the
             UVA kernel's curve (io-backend kernel, one launch) and the copy engine's
             batch-call curve at one piece per block (io-backend direct), over the
             hit's pages (one per token block and layer group, `block_bytes` each)
  recompute  the executor time of the prefill that computes the L tokens from offset 0,
             in the scheduler's chunks (`--max-num-batched-tokens`; one chunk up to it)
  request    the same comparison for a request with a question of `--question-tokens`
             after the prefix: hit = the question's chunk at offset L + the load, miss =
             the whole prompt's prefill from offset 0 (the step's fixed costs cancel)

The cost model serialises the load before the step (layer-wise loading would hide part
of it under the suffix's compute, so the load's share is an upper bound). Ratios are
recompute / load (> 1: loading pays); the crossover is the shortest L from which every
longer one pays.

  python -m benchmarks.policies.strata_breakeven \\
      --out results/policies/strata_breakeven_h200.json     (CPU, seconds; + the .png)
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from kvtier.costmodel import Calibration, CostModel, StepShape, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.offload.items import price_host_loads, price_host_loads_direct
from kvtier.policies import system_cost_config

MODELS = {"llama-3.1-8b": "results/calibration/calib_h200_llama-3.1-8b.json",
          "llama-2-13b": "results/calibration/calib_h200_llama-2-13b.json"}
LENGTHS = tuple(2 ** k for k in range(4, 16))  # 16 ... 32768


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--models", default=",".join(MODELS),
                   help="model presets; each uses its H200 calibration (--no-calibration: roofline)")
    p.add_argument("--gpu", default="h200", help="hardware profile (kvtier.costmodel.hardware)")
    p.add_argument("--calibration", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--question-tokens", type=int, default=128, help="the request view's suffix")
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="the prefill's chunk (default: the engine's)")
    p.add_argument("--out", default="results/policies/strata_breakeven_h200.json")
    p.add_argument("--plot", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--measured", default="results/policies/strata_breakeven_measured_h200.json",
                   help="bench_strata_breakeven's result, drawn beside its model (if present)")
    return p.parse_args(argv)


def cost_model(model: str, args: argparse.Namespace) -> tuple[CostModel, Any]:
    """The simulator's cost model of a dummy-weight engine of `model` (bf16, defaults)."""
    extra = ({"max_num_batched_tokens": args.max_num_batched_tokens}
             if args.max_num_batched_tokens else {})
    config = EngineArgs(model=model, load_format="dummy", max_model_len=max(LENGTHS) * 2,
                        **extra).create_engine_config()
    block_bytes = config.cache.block_bytes(config.model_config, 2)
    calib = Calibration.load(MODELS[model]) if args.calibration and model in MODELS else None
    return CostModel(config.model_config, get_hardware(args.gpu), calib,
                     system_cost_config(config, block_bytes)), config


def prefill_seconds(cm: CostModel, tokens: int, start: int, chunk: int) -> float:
    """Executor seconds of prefilling `tokens` from `start` in chunks of at most `chunk`."""
    total, done = 0.0, 0
    while done < tokens:
        n = min(chunk, tokens - done)
        total += cm.predict(StepShape(prefills=((n, start + done),), num_sampled=1)).executor_s
        done += n
    return total


def hit_pages(config: Any, length: int) -> int:
    """Host pages a hit of `length` tokens loads: one per token block and layer group."""
    cache = config.cache
    return math.ceil(length / cache.block_size) * cache.num_layer_groups(
        config.model_config.num_layers)


def row(cm: CostModel, config: Any, length: int, question: int) -> dict[str, float]:
    pages = hit_pages(config, length)
    chunk = config.scheduler.max_num_batched_tokens
    kernel, direct = price_host_loads(cm, pages), price_host_loads_direct(cm, pages)
    recompute = prefill_seconds(cm, length, 0, chunk)
    miss = prefill_seconds(cm, length + question, 0, chunk)
    hit = prefill_seconds(cm, question, length, chunk)
    return {"tokens": length, "pages": pages, "load_bytes": pages * cm.config.block_bytes,
            "load_kernel_s": kernel, "load_direct_s": direct, "recompute_s": recompute,
            "recompute_over_kernel": recompute / kernel,
            "recompute_over_direct": recompute / direct,
            "request_miss_s": miss, "request_hit_kernel_s": hit + kernel,
            "request_hit_direct_s": hit + direct,
            "request_speedup_kernel": miss / (hit + kernel),
            "request_speedup_direct": miss / (hit + direct)}


def crossover(rows: list[dict[str, float]], key: str) -> int | None:
    """The shortest length from which every longer one has `key` > 1 (None: none pays)."""
    best = None
    for r in reversed(rows):
        if r[key] <= 1.0:
            break
        best = int(r["tokens"])
    return best


def model_result(model: str, args: argparse.Namespace) -> dict[str, Any]:
    cm, config = cost_model(model, args)
    rows = [row(cm, config, n, args.question_tokens) for n in LENGTHS]
    keys = ("recompute_over_kernel", "recompute_over_direct", "request_speedup_kernel",
            "request_speedup_direct")
    return {"block_bytes": cm.config.block_bytes, "block_size": config.cache.block_size,
            "layer_groups": config.cache.num_layer_groups(config.model_config.num_layers),
            "max_num_batched_tokens": config.scheduler.max_num_batched_tokens,
            "calibration": MODELS[model] if cm.calib is not None else None,
            "crossover_tokens": {k: crossover(rows, k) for k in keys}, "rows": rows}


def measured_ratios(path: str) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """{model: {io backend: [(tokens, miss / host hit)]}} of a measured break-even, or {}."""
    import json

    if not path or not Path(path).exists():
        return {}
    with open(path) as f:
        m = json.load(f)
    return {m["model"]: {b: [(r["tokens"], r["miss_over_host_hit"]) for r in res["rows"]]
                         for b, res in m["io_backends"].items()}}


def plot(results: dict[str, dict], path: Path,
         measured: dict[str, dict[str, list[tuple[int, float]]]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4.2), squeeze=False)
    for ax, (model, res) in zip(axes[0], results.items()):
        xs = [r["tokens"] for r in res["rows"]]
        for key, label in (("recompute_over_kernel", "prefix: recompute / load (kernel)"),
                           ("recompute_over_direct", "prefix: recompute / load (direct)"),
                           ("request_speedup_kernel", "request: miss / hit (kernel)"),
                           ("request_speedup_direct", "request: miss / hit (direct)")):
            ax.plot(xs, [r[key] for r in res["rows"]], marker="o", ms=3, label=label)
        for backend, pts in (measured or {}).get(model, {}).items():
            ax.plot([x for x, _ in pts], [y for _, y in pts], marker="x", ms=7, ls=":",
                    label=f"request, measured on the H200: miss / hit ({backend})")
        ax.axhline(1.0, color="grey", lw=0.8, ls="--")
        ax.set(xscale="log", yscale="log", xlabel="cached prefix (tokens)",
               ylabel="x (> 1: loading pays)", title=f"{model}, H200 cost model")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = {m.strip(): model_result(m.strip(), args) for m in args.models.split(",")
               if m.strip()}
    for model, res in results.items():
        print(model, "crossover (tokens):", res["crossover_tokens"])
    write_result(args.out, {"gpu": args.gpu, "question_tokens": args.question_tokens,
                            "lengths": list(LENGTHS), "models": results})
    if args.plot:
        plot(results, Path(args.out).with_suffix(".png"), measured_ratios(args.measured))


if __name__ == "__main__":
    main()
