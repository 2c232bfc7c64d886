"""What a step with host-resident decode rows costs on the H200, fit from the committed
bench_host_resident runs (no GPU needed): per mechanism a fixed cost per layer, paid once a
step however few host rows it has, and a rate for the rows' KV bytes.

For every step with host rows the simulator's cost model (the model's H200 calibration)
prices the same step without them: its decodes through the GPU (a CPU round trip's rows as
decodes of context 1, as NEO's sequential price has them; zero-copy rows with their whole
context, as DirectKV's step is priced). What the measured step took beyond that is the host
rows' cost, fit as

    extra = num_layers x layer_s + kv_bytes / bytes_per_s

over the medians of steps of one shape (run, rows, scheduled requests), each weighted by its
number of steps. Only decode-only steps count (no prefill chunk), and of a shape's those
within twice its fastest (a step that compiled or captured a graph takes far longer). A mechanism
whose runs never vary the host tokens enough keeps the profile's
rate and fits only layer_s. NEO's pipelined steps are priced with the fit and reported as a
check (beside the sequential price), and what they took beyond their pipelined price without
NEO's launch constant is fit as that constant per layer (NEO's predictor charges its lnch_T
per layer; neo/steps.py's LAUNCH_S). That check prices the CPU rows with the h200 profile's
cost, so after the profile takes a new fit, run this once more for its `pipelined_launch`.

Zero-copy rows that also attend a device suffix (DirectKV's partial moves) cost a step more:
fit from the partial-move runs as the step-weighted mean of what their steps took beyond
the zero-copy price, per layer (`split_layer_s`).

  python -m benchmarks.policies.fit_host_rows --out results/calibration/host_rows_h200.json
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.common import write_result
from kvtier.costmodel.hardware import HostAttention, HostAttentionCost, get_hardware
from kvtier.costmodel.shape import StepShape

# The runs' policies by the way their host rows attend (`@0`: the balance lifted, so they
# move). NEO's rows from the runs since its layer calls run on the kernel's own thread
# (a2e16d4; the runs before paid about twice its fixed cost); DirectKV's rows only from the
# runs where its decode-only steps replay the full-model decode graph (the default since
# 6b56c2b): the earlier ones ran them through the piecewise forward, which cost more.
NEO = {"neo:off@0": HostAttention.CPU_ROUND_TRIP, "neo@0": HostAttention.CPU_ROUND_TRIP}
# Since ed23f5c NEO's sequential decode-only steps replay the decode graphs (the default;
# `+piecewise`: --no-neo-graphs); only decode-only steps are fit, so those runs' are graph
# steps.
NEO_GRAPHS = {"neo:off@0": HostAttention.CPU_GRAPH, "neo@0": HostAttention.CPU_GRAPH}
DIRECTKV_GRAPHS = {"directkv@0": HostAttention.ZERO_COPY}
CAL_8B = "results/calibration/calib_h200_llama-3.1-8b.json"
# (result file, calibration of its model, its policies fit): the runs the fit reads.
SOURCES = (
    ("results/policies/host_resident_neo_h200_a2e16d4.json", CAL_8B, NEO),
    ("results/policies/host_resident_neo_long_h200_a2e16d4.json", CAL_8B, NEO),
    ("results/policies/host_resident_ab_h200_3911170.json", CAL_8B, NEO),
    # NEO's graph steps since the layer calls leave two cores (6709e73): the runs on all 16
    # threads before (96c19fd, 962df4b, ed23f5c) paid the preempted team's barriers.
    ("results/policies/host_resident_neo_flags_h200_6709e73.json", CAL_8B, NEO_GRAPHS),
    ("results/policies/directkv_graphs_h200_6b56c2b.json", CAL_8B, DIRECTKV_GRAPHS),
    ("results/policies/directkv_graphs_long_h200_6b56c2b.json", CAL_8B, DIRECTKV_GRAPHS),
    # Every host step pipelined: nothing fit there, read only by the check (CHECKED).
    ("results/policies/host_resident_neo_pipelined_h200_60717a5.json", CAL_8B, {}),
)
CHECKED = {"neo:on@0": HostAttention.CPU_ROUND_TRIP}  # every step pipelined: priced, not fit
# DirectKV's rows with a device suffix (partial moves; the runs with the one-kernel merge):
# what their steps take beyond the zero-copy fit's price is the split rows' cost per layer.
SPLIT = {"directkv:partial@0": HostAttention.ZERO_COPY}
SPLIT_SOURCES = (
    ("results/policies/directkv_partial_merge_h200_4bf6470.json", CAL_8B, SPLIT),
    ("results/policies/directkv_partial_merge_long_h200_4bf6470.json", CAL_8B, SPLIT),
)
MIN_TOKEN_SPREAD = 1.5  # the largest host tokens over the smallest, to fit a rate


@dataclass(frozen=True)
class StepGroup:
    """The median step of one shape in one run, and the GPU part the cost model prices."""

    source: str
    policy: str
    mechanism: HostAttention
    cap: float
    rows: int
    scheduled: int
    num_steps: int
    host_tokens: float
    measured_s: float
    gpu_s: float
    num_layers: int
    kv_bytes_per_token: int
    pipelined_s: float = 0.0  # NEO's pipelined price of the step, no launch constant

    @property
    def kv_bytes(self) -> float:
        return self.host_tokens * self.kv_bytes_per_token


def cost_model_of(result: dict[str, Any], calibration: str):
    """The simulator's cost model for the run's model and batch (the bench's engine args)."""
    from kvtier.engine.args import EngineArgs
    from kvtier.sim import build_sim_engine

    prompt, output = result["prompt"], result["output"]
    engine = build_sim_engine(EngineArgs(
        model=result["model"], load_format="dummy", kv_policy="recompute",
        num_gpu_blocks=max(16384, 16 * (prompt + output)), max_model_len=prompt + output, max_num_seqs=32,
        max_num_batched_tokens=max(2048, prompt)), "h200", calibration)
    return engine.executor.cost_model


def step_shape(scheduled: int, rows: int, host_tokens: float, host_ctx: int | None = None):
    """All decodes, one context each as long as the host rows' mean (the batch's requests
    run in step); the host rows at `host_ctx` when given."""
    ctx = max(1, round(host_tokens / rows))
    return StepShape(num_decodes=scheduled, decode_ctx_sum=(scheduled - rows) * ctx
                     + rows * (ctx if host_ctx is None else host_ctx), decode_ctx_max=ctx,
                     num_sampled=scheduled)


def gpu_seconds(cm, scheduled: int, rows: int, host_tokens: float,
                mechanism: HostAttention) -> float:
    """The step's forward without the host rows' attention."""
    host_ctx = None if mechanism is HostAttention.ZERO_COPY else 1
    return cm.predict(step_shape(scheduled, rows, host_tokens, host_ctx)).executor_s


def pipelined_seconds(cm, scheduled: int, rows: int, host_tokens: float) -> float:
    """NEO's price of the step pipelined (neo/steps.py), without its launch constant."""
    from kvtier.policies.neo.steps import StepMode, StepPrices

    return StepPrices(cm, launch_s=0.0).seconds(step_shape(scheduled, rows, host_tokens),
                                                rows, round(host_tokens), StepMode.PIPELINED)


def groups_of(path: str, calibration: str, policies: dict[str, HostAttention]) -> list[StepGroup]:
    with open(path) as f:
        result = json.load(f)
    cm = cost_model_of(result, calibration)
    per_request = result["prompt"] + result["output"]
    out = []
    for run in result["policies"]:
        mechanism = policies.get(run["policy"])
        if mechanism is None or "steps" not in run:
            continue
        host_steps = [s for s in run["steps"] if s["host_context_tokens"]
                      and not s.get("prefill_tokens")][2:]  # the first two compile
        by_shape: dict[tuple[int, int], list[dict[str, Any]]] = {}
        for s in host_steps:
            rows = math.ceil(s["host_context_tokens"] / per_request)
            by_shape.setdefault((rows, s["num_scheduled"]), []).append(s)
        for (rows, scheduled), steps in sorted(by_shape.items()):
            fastest = min(s["step_s"] for s in steps)
            kept = [s for s in steps if s["step_s"] <= 2 * fastest]
            if len(kept) < 3:
                continue
            tokens = statistics.fmean(s["host_context_tokens"] for s in kept)
            out.append(StepGroup(
                path, run["policy"], mechanism, run["cap"], rows, scheduled, len(kept), tokens,
                statistics.median(s["step_s"] for s in kept),
                gpu_seconds(cm, scheduled, rows, tokens, mechanism), cm.mc.num_layers,
                cm.mc.kv_bytes_per_token(2),
                pipelined_seconds(cm, scheduled, rows, tokens) if run["policy"] in CHECKED
                else 0.0))
    return out


def fit(groups: list[StepGroup], mechanism: HostAttention) -> tuple[HostAttentionCost, bool]:
    """Least squares of the extra over (layers, bytes); the rate held at the profile's when
    the host tokens hardly vary. Returns the cost and whether the rate was fit."""
    extra = np.array([g.measured_s - g.gpu_s for g in groups])
    layers = np.array([g.num_layers for g in groups], dtype=float)
    nbytes = np.array([g.kv_bytes for g in groups])
    w = np.sqrt([g.num_steps for g in groups])  # least squares weighted by steps
    if nbytes.max() >= MIN_TOKEN_SPREAD * nbytes.min():
        (layer_s, s_per_byte), *_ = np.linalg.lstsq(np.stack([layers, nbytes], 1) * w[:, None],
                                                    extra * w, rcond=None)
        if s_per_byte > 0:
            return HostAttentionCost(float(layer_s), float(1 / s_per_byte)), True
    rate = get_hardware("h200").host_attention_cost(mechanism).bytes_per_s
    layer_s = float(np.average((extra - nbytes / rate) / layers, weights=w * w))
    return HostAttentionCost(layer_s, rate), False


def residuals(groups: list[StepGroup], cost: HostAttentionCost) -> list[dict[str, Any]]:
    rows = []
    for g in groups:
        priced = g.gpu_s + cost.seconds(g.kv_bytes, g.num_layers)
        rows.append({"source": g.source, "policy": g.policy, "cap": g.cap, "host_rows": g.rows,
                     "num_scheduled": g.scheduled, "num_steps": g.num_steps,
                     "host_tokens": round(g.host_tokens), "measured_ms": 1e3 * g.measured_s,
                     "gpu_ms": 1e3 * g.gpu_s, "priced_ms": 1e3 * priced,
                     "residual_ms": 1e3 * (g.measured_s - priced)})
    return rows


def launch_fit(groups: list[StepGroup]) -> dict[str, Any]:
    """NEO's launch constant per layer that prices its pipelined steps as measured: the
    step-weighted mean of (measured - pipelined price) / layers."""
    per_layer = [(g.measured_s - g.pipelined_s) / g.num_layers for g in groups]
    layer_s = float(np.average(per_layer, weights=[g.num_steps for g in groups]))
    return {"layer_s": layer_s, "groups": [
        {"source": g.source, "cap": g.cap, "num_scheduled": g.scheduled,
         "num_steps": g.num_steps, "measured_ms": 1e3 * g.measured_s,
         "pipelined_price_ms": 1e3 * g.pipelined_s, "residual_per_layer_ms": 1e3 * r}
        for g, r in zip(groups, per_layer)]}


def split_fit(groups: list[StepGroup], cost: HostAttentionCost) -> dict[str, Any]:
    """The split rows' extra cost per layer: the step-weighted mean of what their steps
    took beyond the zero-copy price (`cost`), over the layers."""
    rows = residuals(groups, cost)
    per_layer = [r["residual_ms"] / 1e3 / g.num_layers for r, g in zip(rows, groups)]
    layer_s = float(np.average(per_layer, weights=[g.num_steps for g in groups]))
    return {"split_layer_s": layer_s, "groups": rows}


def rms_ms(rows: list[dict[str, Any]], by_step: bool = False) -> float:
    """Root mean square of the shapes' residuals (each shape once, or weighted by steps)."""
    if not rows:
        return 0.0
    w = [r["num_steps"] if by_step else 1 for r in rows]
    return math.sqrt(sum(wi * r["residual_ms"] ** 2 for wi, r in zip(w, rows)) / sum(w))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default=None, help="result JSON")
    args = p.parse_args(argv)
    groups = [g for path, calib, fit_ in SOURCES for g in groups_of(path, calib, fit_)]
    checks = [g for path, calib, _ in SOURCES for g in groups_of(path, calib, CHECKED)]
    mechanisms: dict[str, Any] = {}
    for mechanism in HostAttention:
        mine = [g for g in groups if g.mechanism is mechanism]
        cost, rate_fit = fit(mine, mechanism)
        rows = residuals(mine, cost)
        mechanisms[mechanism.value] = {
            "layer_s": cost.layer_s, "bytes_per_s": cost.bytes_per_s, "rate_fit": rate_fit,
            "rms_residual_ms": rms_ms(rows), "rms_residual_ms_by_step": rms_ms(rows, True),
            "groups": rows}
        print(f"{mechanism.value:15s} layer {1e3 * cost.layer_s:.3f} ms  "
              f"{cost.bytes_per_s / 1e9:.1f} GB/s ({'fit' if rate_fit else 'held'})  "
              f"rms {rms_ms(rows):.1f} ms over {len(rows)} shapes "
              f"({rms_ms(rows, True):.1f} by step)")
        for r in rows:
            print(f"    {r['policy']:9s} cap {r['cap']:.2f} rows {r['host_rows']} sched "
                  f"{r['num_scheduled']:2d}: measured {r['measured_ms']:6.1f} priced "
                  f"{r['priced_ms']:6.1f} ms (gpu {r['gpu_ms']:5.1f})")
    zero_copy = mechanisms["zero_copy"]
    split = split_fit([g for path, calib, fit_ in SPLIT_SOURCES
                       for g in groups_of(path, calib, fit_)],
                      HostAttentionCost(zero_copy["layer_s"], zero_copy["bytes_per_s"]))
    zero_copy["split_layer_s"] = split["split_layer_s"]
    print(f"zero_copy split rows: {1e3 * split['split_layer_s']:.4f} ms a layer more, over "
          f"{len(split['groups'])} shapes")
    cpu = HostAttentionCost(mechanisms["cpu_round_trip"]["layer_s"],
                            mechanisms["cpu_round_trip"]["bytes_per_s"])
    pipelined = residuals(checks, cpu)
    for r in pipelined:  # priced as sequential: what pipelining should have saved
        print(f"    check neo cap {r['cap']:.2f} rows {r['host_rows']}: measured "
              f"{r['measured_ms']:6.1f}, sequential price {r['priced_ms']:6.1f} ms")
    launch = launch_fit(checks)
    print(f"neo pipelined: {1e3 * launch['layer_s']:.3f} ms a layer beyond its price "
          f"(NEO's lnch_T: 0.8)")
    if args.out:
        write_result(args.out, {"sources": [s for s, _, _ in SOURCES],
                                "split_sources": [s for s, _, _ in SPLIT_SOURCES],
                                "split_groups": split["groups"], "mechanisms": mechanisms,
                                "pipelined_vs_sequential_price": pipelined,
                                "pipelined_launch": launch})


if __name__ == "__main__":
    main()
