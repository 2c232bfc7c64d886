"""Raw measurements of `kvtier profile` -> a Calibration. Runs anywhere (no GPU), so a
calibration can be refitted from its own `raw` section:

    python -m kvtier.profiler.fit results/calibration/calib_h200_llama-2-13b.json

Least squares minimise *relative* error (each row divided by its measured time): steps
span two orders of magnitude and each should count alike.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import nnls

from kvtier.bench.environment import git_info
from kvtier.config import ModelConfig
from kvtier.costmodel.calibration import Calibration, HostParams, LoopParams, PrefillFit
from kvtier.costmodel.curves import Curve
from kvtier.costmodel.hardware import CopyCost, get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.operators import Shapes, attn_prefill
from kvtier.costmodel.shape import StepShape
from kvtier.model.hf_config import model_config_from_hf
from kvtier.profiler.host_fit import fit_host, issue_launch_s, piece_layer_s, score_host


def relative_nnls(features: np.ndarray, seconds: np.ndarray) -> np.ndarray:
    """Non-negative x minimising sum(((features @ x) - seconds) / seconds)^2."""
    w = 1.0 / seconds
    x, _ = nnls(features * w[:, None], seconds * w)
    return x


def mape(pred: list[float] | np.ndarray, true: list[float] | np.ndarray) -> float:
    p, t = np.asarray(pred, float), np.asarray(true, float)
    return float(np.mean(np.abs(p - t) / t)) if len(t) else float("nan")


def fit_prefill(raw: list, shapes: Shapes) -> tuple[PrefillFit, float]:
    rows, secs = [], []
    for prefills, t in raw:
        pre = tuple((int(n), int(s)) for n, s in prefills)
        op = attn_prefill(shapes, pre)
        rows.append([1.0, op.flops, sum(n for n, _ in pre)])
        secs.append(t)
    a, s = np.array(rows), np.array(secs)
    x = relative_nnls(a, s)
    return PrefillFit(*map(float, x)), mape(a @ x, s)


def fit_copy(raw: list, block_bytes: int) -> tuple[CopyCost, float]:
    """Affine summary alpha*bytes + beta of the swap path, least squares in absolute time
    (the large copies a preemption makes matter; the measured curve is what predicts)."""
    a = np.array([[n * block_bytes, 1.0] for n, _ in raw], float)
    s = np.array([t for _, t in raw], float)
    x, _ = nnls(a, s)
    return CopyCost(float(x[0]), float(x[1])), mape(a @ x, s)


IDLE_GAP_S = 0.02  # a longer gap between steps is the bench loop waiting for arrivals


def serving_loop_rows(serving: list[dict], bin_size: int = 16) -> list[list[float]]:
    """[requests, sampled, seconds] per bin of scheduled requests: the means of the serving
    trace's loop gaps (idle waits left out). Means, not medians: a simulated run's time is
    the sum of its gaps, collector pauses included.

    On the H200 the real engine's gaps ran several times what the same loop costs around
    the simulated executor in a process of its own, so the loop is priced from the real
    engine (results/calibration/calib_h200_llama-2-13b.json, its serving trace)."""
    bins: dict[int, list[tuple[int, int, float]]] = {}
    for st in serving:
        gap = st.get("loop_s")
        if gap is None or gap > IDLE_GAP_S:
            continue
        shape = StepShape.from_json(st["shape"])
        bins.setdefault(shape.num_reqs // bin_size, []).append(
            (shape.num_reqs, shape.num_sampled, gap))
    return [np.mean(np.array(items, float), axis=0).tolist()
            for _, items in sorted(bins.items())]


def fit_loop(raw: list) -> tuple[LoopParams, float]:
    a = np.array([[1.0, r, k] for r, k, _ in raw], float)
    s = np.array([t for _, _, t in raw], float)
    x = relative_nnls(a, s)
    return LoopParams(*map(float, x)), mape(a @ x, s)


def launch_params(measured: dict | None) -> dict[str, float]:
    """HostParams' piecewise launch costs from the profiler's `host_launches` sweep: the
    attention call's host time over decode rows (D), prefill rows (P) and both (M) gives
    kv_write and the rest of the call (P + D - M), the decode wrapper (M - P), the prefill
    wrapper (M - D). Missing figures keep their defaults."""
    if not measured:
        return {}
    out: dict[str, float] = {}
    d, p, m = (measured.get(f"attn_{k}_s") for k in ("decode", "prefill", "mixed"))
    if d is not None and p is not None and m is not None:
        out.update(attn_write_s=max(0.0, p + d - m), attn_decode_s=max(0.0, m - p),
                   attn_prefill_s=max(0.0, m - d))
    if measured.get("op_s") is not None:
        out["op_launch_s"] = float(measured["op_s"])
    if measured.get("replay_s") is not None:
        out["replay_s"] = float(measured["replay_s"])
    return out


def meta_model_config(meta: dict) -> ModelConfig:
    """The profiled model's architecture, as the raw measurements recorded it."""
    return model_config_from_hf(meta["hf_config"], name=meta["model"])


def _model(calib: Calibration, meta: dict) -> CostModel:
    return CostModel(meta_model_config(meta), get_hardware(calib.hardware), calib,
                     CostModelConfig(cuda_graphs=meta["cuda_graphs"],
                                     max_num_seqs=meta["max_num_seqs"],
                                     block_bytes=meta["block_bytes"],
                                     piecewise_graphs=meta.get("piecewise_graphs", False),
                                     max_num_batched_tokens=meta["max_num_batched_tokens"]))


def host_steps(raw: dict[str, Any], source: str = "auto") -> tuple[list[dict], bool]:
    """The steps the host terms are fitted to, and whether they are the serving trace's
    (`auto` or `serving`: where it ran synchronously), else the sweep steps. An asynchronous
    trace's walls run from a step's launch to its result, across the next step's scheduling:
    not one step's time.
    Traces from before the meta said so show it in their gaps: a step launched before the
    previous one's result was read leaves a negative one."""
    serving = raw.get("serving_steps")
    if source == "sweep" or not serving:
        return raw["steps"], False
    overlapped = any((st.get("loop_s") or 0.0) < 0 for st in serving)
    if raw["meta"].get("async_scheduling") or overlapped:
        raise ValueError("the serving trace ran with async scheduling: its walls are not "
                         "step times; refit with --host-steps sweep")
    return serving, True


def fit_calibration(raw: dict[str, Any], environment: dict | None = None,
                    host_source: str = "auto") -> Calibration:
    meta = raw["meta"]
    shapes = Shapes.of(meta_model_config(meta))
    prefill, prefill_err = fit_prefill(raw["attn_prefill"], shapes)
    copy_out, out_err = fit_copy(raw["copies"]["out"], meta["block_bytes"])
    copy_in, in_err = fit_copy(raw["copies"]["in"], meta["block_bytes"])
    fitted_on, serving = host_steps(raw, host_source)
    serving_loop = serving_loop_rows(fitted_on if serving else [])
    loop_source = raw.get("loop")
    if len(serving_loop) >= 3:
        loop_source = serving_loop
    loop, loop_err = fit_loop(loop_source) if loop_source else (LoopParams(), None)
    calib = Calibration(
        hardware=meta["hardware"], model=meta["model"], model_dims=meta["model_dims"],
        max_model_len=meta["max_model_len"], **Calibration.measured_curves(raw),
        attn_prefill=prefill, host=HostParams(**launch_params(raw.get("host_launches"))),
        loop=loop, copy_out=copy_out,
        copy_in=copy_in, copy_out_blocks=Curve.from_json(raw["copies"]["out"]),
        copy_in_blocks=Curve.from_json(raw["copies"]["in"]), memory=raw.get("memory", {}), raw=raw,
        environment=environment or {},
    )
    make = lambda c: _model(c, meta)  # noqa: E731
    # The sweep steps' measured issue times give the host's launch costs, eager (launch_s)
    # and piecewise (piece_layer_s, which counts launch_s for the head), before the host
    # terms are fitted on top of them (serving steps have walls only).
    launch = issue_launch_s(calib, make, raw["steps"])
    if launch is not None:
        calib = replace(calib, host=replace(calib.host, launch_s=launch))
    piece = piece_layer_s(calib, make, raw["steps"])
    if piece is not None:
        calib = replace(calib, host=replace(calib.host, piece_layer_s=piece))
    host, host_report = fit_host(calib, make, fitted_on)
    report = {"host_launches": launch_params(raw.get("host_launches")), "piece_layer_s": piece,
              "attn_prefill_mape": prefill_err, "copy_out_affine_mape": out_err,
              "copy_in_affine_mape": in_err, "loop_mape": loop_err,
              "loop_fitted_on": ("serving steps" if loop_source is serving_loop
                                 else "the simulated engine's loop" if loop_source else None),
              "host_fitted_on": "serving steps" if serving else "sweep steps",
              "steps": host_report}
    if serving:  # the synthetic sweep steps become a check
        report["sweep_steps_check"] = score_host(replace(calib, host=host), make, raw["steps"])
    return replace(calib, host=host, fit_report=report)


def main() -> None:
    ap = argparse.ArgumentParser(description="refit a calibration from its raw measurements")
    ap.add_argument("calibration")
    ap.add_argument("--out", help="where to write (default: in place)")
    ap.add_argument("--host-steps", choices=("auto", "serving", "sweep"), default="auto",
                    help="fit the host terms to the serving trace (auto: where it ran "
                         "synchronously) or to the sweep steps")
    args = ap.parse_args()
    old = Calibration.load(args.calibration)
    env = dict(old.environment)
    env["refit"] = "python -m kvtier.profiler.fit --host-steps {} (the fit of kvtier commit {})".format(
        args.host_steps, git_info()["commit"])
    new = fit_calibration(old.raw, env, args.host_steps)
    new.save(args.out or args.calibration)
    print(new.fit_report)


if __name__ == "__main__":
    main()
