"""Fidelity of the simulator (issue 6): the same trace on the real H200 and in the simulator.

  real   (GPU)  serve a ShareGPT trace with gamma arrivals through the bench harness,
                recording every step's plan shape and `ModelRunner.execute` wall time;
  sim    (CPU)  replay the same trace on the simulated engine (same config, same KV pool
                size, the calibration `kvtier profile` wrote), score the cost model on
                every real step, and write the errors and plots.

  python -m benchmarks.fidelity.fidelity_report real \
      --workload .carry/sharegpt_llama2-13b_1000.json \
      --model llama-2-13b --num-requests 400 --rate 6 --out $OUT/fidelity_real.json
  python -m benchmarks.fidelity.fidelity_report sim \
      --real results/fidelity/fidelity_real_h200.json \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --workload .carry/sharegpt_llama2-13b_1000.json \
      --out results/fidelity/fidelity_h200.json --plot results/fidelity/fidelity_h200.png

(`.carry/sharegpt_llama2-13b_1000.json` is `prepare_workload.py --model llama-2-13b
--num-prompts 1000 --seed 0`, deterministic, not committed.)

The calibration is fitted only to `kvtier profile`'s synthetic sweeps; the trace's steps
are held out, so the step-time errors here are out-of-sample.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from benchmarks.common import write_result
from benchmarks.fidelity.fidelity_diagnostic import serving_host_diagnostic
from benchmarks.fidelity.fidelity_scoring import score_steps, summary_errors
from benchmarks.fidelity.fidelity_trace import engine_args, load_requests, request_rows, simulate
from kvtier.bench.arrivals import PAPER_AZURE_CV
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import engine_summary, summarize_run
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.costmodel.calibration import Calibration
from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel
from kvtier.profiler.recording import StepRecord
from kvtier.sim.factory import sim_pool_sizes


def allocator_probe():
    """The CUDA caching allocator's growth counters, or None off the GPU."""
    import torch

    if not torch.cuda.is_available():
        return None

    def read() -> list[int]:
        st = torch.cuda.memory_stats()
        return [st.get("segment.all.allocated", 0), st.get("num_alloc_retries", 0),
                st.get("reserved_bytes.all.current", 0)]

    return read


@contextmanager
def gc_recorder():
    """Python's garbage collections while the block runs: [start (perf_counter, the steps'
    clock), seconds, generation] each, to tell a collector pause from a slow step."""
    events: list[list] = []
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            events.append([started[0], time.perf_counter() - started[0], info["generation"]])

    gc.callbacks.append(on_gc)
    try:
        yield events
    finally:
        gc.callbacks.remove(on_gc)


# ---- real ------------------------------------------------------------------------------------------
def run_real(args: argparse.Namespace) -> None:
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.profiler.recording import RecordingExecutor
    from kvtier.profiler.warmup import warm_decode_splits

    cfg = {"model": args.model, "max_model_len": args.max_model_len,
           "max_num_seqs": args.max_num_seqs, "kv_policy": args.kv_policy,
           "piecewise_graphs": args.piecewise_graphs}
    workload = {"path": args.workload, "num_requests": args.num_requests, "rate": args.rate,
                "cv": args.cv, "seed": args.seed}
    reqs = load_requests(args.workload, args.num_requests, args.rate, args.cv, args.seed)
    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(engine_args(cfg))
    warm = [replace(r, output_len=8, arrival_s=0.0) for r in reqs[:4]]
    run_workload(EngineBackend(engine), warm, RunOptions(progress=False, id_prefix="warmup"))
    sched = engine.config.scheduler
    n_splits = warm_decode_splits(engine.executor, sched.max_num_seqs, sched.max_model_len)
    print(f"engine ready in {time.perf_counter() - t0:.1f} s ({n_splits} split variants)", flush=True)
    recorder = RecordingExecutor(engine.executor,
                                 probe=allocator_probe() if args.allocator_probe else None)
    engine.executor = recorder
    with gc_recorder() as gc_events:
        result = run_workload(EngineBackend(engine), reqs, RunOptions(progress=False))
    kv = engine.kv_manager
    cfg.update(num_gpu_blocks=kv.gpu.num_blocks, num_host_blocks=kv.host.num_blocks)
    summary = summarize_run(result)
    write_result(args.out, {
        "git_commit_env": os.environ.get("KVTIER_GIT_COMMIT"), "config": cfg, "workload": workload, "summary": summary.to_dict(),
        "engine": engine_summary(result), "max_submit_lag_s": result.max_submit_lag_s,
        "requests": request_rows(result), "steps": [r.to_json() for r in recorder.records],
        "gc_events": gc_events,
        # per step: [device segments cudaMalloc'ed, allocation retries (cached blocks freed,
        # a device sync), reserved bytes], cumulative, read after the step
        "allocator": recorder.probes if args.allocator_probe else None,
        # time.time() - time.perf_counter(): puts the steps on the wall clock (nvidia-smi logs)
        "wall_minus_perf_counter_s": time.time() - time.perf_counter()})
    print(f"real: {summary.request_throughput:.2f} req/s, {len(recorder.records)} steps, "
          f"{time.perf_counter() - t0:.1f} s", flush=True)


# ---- sim -------------------------------------------------------------------------------------------
def score_report(real: dict, calib_path: str, real_path: str) -> dict:
    calib = Calibration.load(calib_path)
    engine, result = simulate(real, calib)
    cm: CostModel = engine.executor.cost_model
    steps = [StepRecord.from_json(r) for r in real["steps"]]
    sim_summary = summarize_run(result).to_dict()
    own = sim_pool_sizes(replace_blocks(engine_args(real["config"])).create_engine_config(),
                         get_hardware("h200"), 1, calib)
    return {
        "real_run": real_path, "calibration": calib_path, "config": real["config"],
        "workload": real["workload"],
        "errors": summary_errors(real["summary"], sim_summary),
        "step_time": score_steps(cm, steps),
        "diagnostic_serving_host_fit": serving_host_diagnostic(real, calib, cm),
        "real": {"summary": real["summary"], "engine": real["engine"]},
        "sim": {"summary": sim_summary, "engine": engine_summary(result),
                "requests": request_rows(result)},
        "pool_blocks": {"real": real["config"]["num_gpu_blocks"], "sim_estimate": own.num_gpu_blocks},
    }


def replace_blocks(args):
    return replace(args, num_gpu_blocks=None, num_host_blocks=None)


def run_sim(args: argparse.Namespace) -> None:
    real = json.loads(Path(args.real).read_text())
    if args.workload:  # the prepared workload where it lies here (the real run's path was there)
        real["workload"]["path"] = args.workload
    report = score_report(real, args.calibration, args.real)
    write_result(args.out, report)
    if args.plot:
        plot_both(real, report, args.plot)
    print(json.dumps(report["errors"], indent=1))


def plot_both(real: dict, report: dict, path: str) -> None:
    """The headline (profile calibration, every step held out) and the diagnostic (host
    refit on the trace's first half; its second half's steps)."""
    from dataclasses import replace

    from benchmarks.fidelity.fidelity_plots import plot_fidelity
    from kvtier.costmodel.calibration import Calibration, HostParams
    from kvtier.profiler.recording import StepRecord

    calib = Calibration.load(report["calibration"])
    records = [StepRecord.from_json(r) for r in real["steps"]]
    plot_fidelity(real, calib, records, report["sim"]["requests"], report["errors"],
                  report["step_time"], "calibration: kvtier profile (every trace step held out)",
                  path)
    diag = report["diagnostic_serving_host_fit"]
    refit = replace(calib, host=HostParams(**diag["host"]))
    plot_fidelity(real, refit, records[len(records) // 2:], diag["requests"],
                  diag["errors_all_requests"], diag["held_out_steps"],
                  "diagnostic: host terms refit on the trace's first half; steps of its second half",
                  path.replace(".png", "_serving_host.png"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="phase", required=True)
    r = sub.add_parser("real")
    r.add_argument("--workload", required=True, help="prepare_workload.py JSON")
    r.add_argument("--model", default="llama-2-13b")
    r.add_argument("--num-requests", type=int, default=400)
    r.add_argument("--rate", type=float, default=6.0, help="mean arrivals per second")
    r.add_argument("--cv", type=float, default=PAPER_AZURE_CV, help="gamma CV of the gaps")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--max-model-len", type=int, default=4096)
    r.add_argument("--max-num-seqs", type=int, default=256)
    r.add_argument("--kv-policy", default="recompute")
    r.add_argument("--piecewise-graphs", action=argparse.BooleanOptionalAction, default=True,
                   help="piecewise CUDA graphs for mixed steps, the engine's default (the sim "
                        "phase follows the record; records without the key ran without)")
    r.add_argument("--allocator-probe", action="store_true",
                   help="read the CUDA caching allocator's counters after every step (costs "
                        "~0.2 ms of loop time a step: a diagnostic, not for the headline)")
    r.add_argument("--out", required=True)
    r.set_defaults(func=run_real)
    s = sub.add_parser("sim")
    s.add_argument("--real", required=True, help="the real phase's JSON")
    s.add_argument("--calibration", required=True)
    s.add_argument("--out", required=True)
    s.add_argument("--plot", help="PNG to write")
    s.add_argument("--workload", help="the prepare_workload.py JSON, if not at the recorded path")
    s.set_defaults(func=run_sim)
    args = ap.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
