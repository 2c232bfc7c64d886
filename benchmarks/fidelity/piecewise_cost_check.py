"""Device check of the cost model's piecewise-graph pricing (issue 6): build the engine with
piecewise graphs, measure the host launch costs (`kvtier profile`'s host_launches sweep) and
mixed/prefill steps through the pieces (walls and issue times), then predict each step with
an existing calibration's operator curves + the measured launch costs.

    python -m benchmarks.fidelity.piecewise_cost_check --model llama-3.1-8b \
        --calibration results/calibration/calib_h200_llama-3.1-8b.json --out check.json
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np
import torch

from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.profiler.fit import launch_params
from kvtier.profiler.host_fit import HostFitter
from kvtier.profiler.step_sweeps import StepSweeper, step_cases
from kvtier.profiler.sweeps import OpSweeper
from kvtier.profiler.timing import DeviceTimer
from kvtier.profiler.warmup import warm_decode_splits


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--num-gpu-blocks", type=int)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    engine = LLMEngine.from_engine_args(EngineArgs(
        model=a.model, load_format="dummy", max_model_len=a.max_model_len,
        piecewise_graphs=True, max_num_batched_tokens=a.max_num_batched_tokens,
        gpu_memory_utilization=0.85, num_gpu_blocks=a.num_gpu_blocks))
    runner, sched = engine.executor, engine.config.scheduler
    if runner.piecewise is None or not runner.piecewise.graphs:
        print("note: no pieces captured (not on a GPU?): steps run eagerly, priced as pieces")
    runner.gpu_kv.normal_()
    warm_decode_splits(runner, sched.max_num_seqs, sched.max_model_len)
    timer = DeviceTimer(runner.device, reps=5)
    ops = OpSweeper(runner, timer)
    launches = ops.host_launches()
    steps = StepSweeper(runner, timer, ops.builder)
    pool = ops.builder.num_blocks // runner.num_groups * runner.block_size
    cases = [c for c in step_cases(sched.max_num_seqs, sched.max_num_batched_tokens,
                                   sched.max_model_len, pool) if c[1]]
    rows = steps.steps(cases)
    calib = Calibration.load(a.calibration)
    calib = replace(calib, host=replace(calib.host, **launch_params(launches)))
    cfg = CostModelConfig(max_num_seqs=sched.max_num_seqs, block_bytes=engine.block_bytes,
                          piecewise_graphs=True,
                          max_num_batched_tokens=sched.max_num_batched_tokens)
    make = lambda c: CostModel(engine.model_config, get_hardware("h200"), c, cfg)  # noqa: E731
    shapes = [StepShape.from_json(r["shape"]) for r in rows]
    walls = np.array([r["wall_s"] for r in rows])
    fitter = HostFitter(calib, make, shapes, walls)
    keep = np.ones(len(rows), bool)
    refit = replace(calib, host=fitter.terms(calib.host.launch_s, keep))
    out = {"launches": launches, "host_params": launch_params(launches),
           "prep_refit": {k: getattr(refit.host, k) for k in
                          ("eager_s", "eager_s_per_req", "eager_s_per_token")}, "steps": []}
    for name, c in (("calib_prep", calib), ("refit_prep", refit)):
        cm = make(c)
        rel = []
        for r, sh in zip(rows, shapes):
            cost = cm.predict(sh)
            t = cm.piecewise_size(sh)
            rel.append(cost.executor_s / r["wall_s"] - 1)
            if name == "refit_prep":
                out["steps"].append({
                    "decodes": sh.num_decodes, "prefills": sh.prefills, "tokens": sh.num_tokens,
                    "padded": t, "wall_ms": r["wall_s"] * 1e3, "pred_ms": cost.executor_s * 1e3,
                    "issue_pw_ms": (r.get("issue_piecewise_s") or 0) * 1e3,
                    "pred_issue_ms": cm.piecewise_issue_seconds(sh, t) * 1e3 if t else None,
                    "issue_eager_ms": (r.get("issue_s") or 0) * 1e3})
        rel = np.array(rel)
        out[name] = {"mape": float(np.abs(rel).mean()), "bias": float(rel.mean()),
                     "max_ape": float(np.abs(rel).max())}
    print(json.dumps({k: v for k, v in out.items() if k != "steps"}, indent=1))
    for s in out["steps"]:
        print(f"  d{s['decodes']:>3} T{s['tokens']:>5}->{s['padded']}: wall {s['wall_ms']:.2f} "
              f"pred {s['pred_ms']:.2f} ms; issue pieces {s['issue_pw_ms']:.2f} pred "
              f"{s['pred_issue_ms']:.2f}, eager {s['issue_eager_ms']:.2f}")
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, default=str)


if __name__ == "__main__":
    main()
