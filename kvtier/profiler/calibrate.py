"""`kvtier profile MODEL --out calib.json`: measure the model's operators and whole steps on
this GPU, fit the cost model's calibration, write it.

    GEMMs       the model's four projections (each layer's own weights) and the lm_head,
                at token counts from 1 to max_num_batched_tokens
    elementwise a layer's norms, rotary, silu and mul; embedding + final norm; the sampler
    attention   decode over (batch x context), with graph splits and eager splits;
                prefill chunks alone, batched and after a cached prefix
    copies      the runner's swap-out / swap-in of 1..256 blocks
    steps       whole `ModelRunner.execute` calls on decode-only (graph), mixed and prefill
                plans (through piecewise graphs when the engine has them on:
                --piecewise-graphs), plus the host time to issue an eager forward (and a
                piecewise one)
    launches    host time of the launches a piecewise step issues: a piece's graph replay,
                the attention backend's wrappers, a torch copy
    serving     a short synthetic trace served by the engine, every step recorded: the host
                parameters are fitted to these (the host's launch cost while serving is not
                what back-to-back repetitions of one step show), the sweep steps check them;
                so is the engine loop's host time between steps
    loop        the engine loop's host time around the simulated executor (CPU only): the
                loop's parameters where the serving trace has no gaps recorded
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.environment import git_info
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.costmodel.calibration import Calibration, model_dims
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.model.presets import preset_config
from kvtier.profiler.fit import fit_calibration
from kvtier.profiler.loop_overhead import loop_workload, measure_loop_overhead
from kvtier.profiler.recording import RecordingExecutor, loop_overheads
from kvtier.profiler.step_sweeps import StepSweeper, step_cases
from kvtier.profiler.sweeps import Log, OpSweeper
from kvtier.profiler.timing import DeviceTimer
from kvtier.profiler.warmup import warm_decode_splits
from kvtier.runner.model_runner import ModelRunner

GEMM_ROWS = [1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224,
             240, 256, 288, 320, 384, 448, 512, 640, 768, 1024, 1536, 2048, 3072, 4096, 6144,
             8192]
ELEMENTWISE_TOKENS = [1, 4, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
SAMPLE_ROWS = [1, 4, 16, 64, 128, 256]
DECODE_BATCHES = [1, 4, 16, 32, 64, 128, 256]
# Past the largest context the cost model extrapolates proportionally, which at a few rows
# (not yet bandwidth-bound at 2,048 tokens) prices 8K contexts about twice their marginal
# cost (docs/RESULTS.md, the host tier's simulator against the H200): a profile made with a
# larger --max-model-len measures the long ones too (the points whose KV fits the pool).
DECODE_CONTEXTS = [64, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]
COPY_BLOCKS = [1, 4, 16, 64, 256]
QUICK = {"gemm": [1, 8, 64], "tokens": [1, 16, 64], "sample": [1, 8], "batches": [1, 4],
         "contexts": [16, 64], "copies": [1, 4]}


def prefill_cases(max_tokens: int, max_len: int) -> list[list[tuple[int, int]]]:
    single = [[(n, 0)] for n in (16, 64, 128, 256, 512, 1024, 2048, 4000, 8000)]
    batched = [[(128, 0)] * 4, [(256, 0)] * 8, [(64, 0)] * 16, [(1024, 0)] * 2,
               [(300, 0), (50, 0), (900, 0)], [(600, 0), (200, 0)]]
    chunked = [[(512, 1024)], [(2000, 2000)], [(1000, 3000)], [(256, 512)]]
    return [c for c in single + batched + chunked
            if sum(n for n, _ in c) <= max_tokens and all(n + s < max_len for n, s in c)]


def detect_hardware() -> str:
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    if "H200" in name:
        return "h200"
    if "A100" in name and "80GB" in name:
        return "a100-80gb-pcie"
    from kvtier.costmodel.hardware import hardware_names

    raise SystemExit(f"kvtier profile: no hardware profile for {name!r}: it calibrates a CUDA "
                     f"GPU; pass --hardware NAME, one of {', '.join(hardware_names())}")


def hf_config(model: str) -> dict:
    preset = preset_config(model)
    if preset is not None:
        return preset
    return json.loads((Path(model).expanduser() / "config.json").read_text())


def model_runner(engine: LLMEngine) -> ModelRunner:
    """The engine's model runner: the profiler times its kernels and graphs."""
    if not isinstance(engine.executor, ModelRunner):
        raise TypeError(f"profiling needs a ModelRunner, not {type(engine.executor).__name__}")
    return engine.executor


def profile_meta(engine: LLMEngine, hardware: str) -> dict:
    c, runner = engine.config, model_runner(engine)
    return {
        "hardware": hardware, "model": c.model, "hf_config": hf_config(c.model),
        "model_dims": model_dims(engine.model_config),
        "max_model_len": c.scheduler.max_model_len, "max_num_seqs": c.scheduler.max_num_seqs,
        "max_num_batched_tokens": c.scheduler.max_num_batched_tokens,
        "block_size": c.cache.block_size, "layers_per_block": c.cache.layers_per_block,
        "block_bytes": engine.block_bytes, "cuda_graphs": runner.graphs is not None,
        # the setting (the cost model prices pieces only with cuda_graphs, as the runner
        # captures them) and whether this runner ran its mixed steps through them
        "piecewise_graphs": bool(c.piecewise_graphs),
        "piecewise_captured": bool(runner.piecewise is not None and runner.piecewise.graphs),
        "device": str(runner.device), "dtype": str(runner.dtype),
        "async_scheduling": bool(c.scheduler.async_scheduling),
    }


def memory_figures(engine: LLMEngine) -> dict:
    """What the real builder left for KV: reserved = budget - weights - KV pool."""
    c = engine.config
    kv_blocks = engine.scheduler.kv.gpu.num_blocks
    out = {"num_gpu_blocks": kv_blocks, "block_bytes": engine.block_bytes,
           "gpu_memory_utilization": c.cache.gpu_memory_utilization,
           "max_num_batched_tokens": c.scheduler.max_num_batched_tokens,
           "max_model_len": c.scheduler.max_model_len,
           "weight_bytes": engine.model_config.num_params() * 2}
    if torch.cuda.is_available() and c.cache.kv_cache_gb is None and c.cache.num_gpu_blocks is None:
        total = torch.cuda.get_device_properties(0).total_memory
        out["total_memory_bytes"] = total
        out["reserved_bytes"] = (total * c.cache.gpu_memory_utilization - out["weight_bytes"]
                                 - kv_blocks * engine.block_bytes)
    return out


@torch.inference_mode()
def profile_engine(engine: LLMEngine, hardware: str, quick: bool = False, log: Log = print,
                   checkpoint: Callable[[dict], None] = lambda raw: None,
                   serve_requests: int = 0) -> dict:
    """Every sweep on a freshly built engine's runner; returns the raw measurements
    (`checkpoint` sees them after each sweep, so a run cut short keeps what it measured)."""
    runner, sched = model_runner(engine), engine.config.scheduler
    timer = DeviceTimer(runner.device, reps=2 if quick else 5)
    if runner.device.type == "cuda":
        assert runner.gpu_kv is not None  # the engine allocated its pool
        runner.gpu_kv.normal_()  # never time on zeros
    ops = OpSweeper(runner, timer, log)
    q = QUICK if quick else {}
    t_max, max_len = sched.max_num_batched_tokens, sched.max_model_len
    rows = [m for m in q.get("gemm", GEMM_ROWS) if m <= t_max]
    tokens = [t for t in q.get("tokens", ELEMENTWISE_TOKENS) if t <= t_max]
    if runner.piecewise is not None and runner.piecewise.graphs and not quick:
        # pieces run their GEMMs and elementwise kernels at these padded counts exactly
        rows = sorted({*rows, *runner.piecewise.sizes})
        tokens = sorted({*tokens, *runner.piecewise.sizes})
    batches = [b for b in q.get("batches", DECODE_BATCHES) if b <= sched.max_num_seqs]
    contexts = [c for c in q.get("contexts", DECODE_CONTEXTS) if c < max_len]
    raw: dict = {"meta": profile_meta(engine, hardware)}
    t0 = time.perf_counter()
    raw["gemm"] = ops.gemms(rows)
    checkpoint(raw)
    raw["elementwise"] = ops.elementwise(tokens)
    raw["head_elementwise"] = ops.head_elementwise(tokens)
    checkpoint(raw)
    raw["sample"] = ops.sample([s for s in q.get("sample", SAMPLE_ROWS) if s <= sched.max_num_seqs])
    raw["attn_decode_graph"] = ops.decode_grid(batches, contexts, graph_splits=True)
    raw["attn_decode_eager"] = ops.decode_grid(batches, contexts, graph_splits=False)
    checkpoint(raw)
    cases = prefill_cases(t_max, max_len)
    raw["attn_prefill"] = ops.prefill_cases(cases[:4] if quick else cases)
    checkpoint(raw)
    log(f"operators: {time.perf_counter() - t0:.1f} s")
    raw["host_launches"] = ops.host_launches()
    steps = StepSweeper(runner, timer, ops.builder, log)
    raw["copies"] = steps.copies(q.get("copies", COPY_BLOCKS))
    checkpoint(raw)
    pool_tokens = ops.builder.num_blocks // runner.num_groups * runner.block_size
    all_cases = step_cases(sched.max_num_seqs, t_max, max_len, pool_tokens)
    raw["steps"] = steps.steps(all_cases[::8] if quick else all_cases)
    if serve_requests:
        raw["serving_steps"] = serving_steps(engine, serve_requests, log)
        checkpoint(raw)
    raw["memory"] = memory_figures(engine)
    raw["meta"]["graph_capture_fallbacks"] = timer.fallbacks
    log(f"operators + steps: {time.perf_counter() - t0:.1f} s")
    return raw


def serving_steps(engine: LLMEngine, num_requests: int, log: Log = print) -> list[dict]:
    """Serve a synthetic trace (ShareGPT-like lengths, arrivals faster than the engine) and
    record every step's shape and execute time."""
    sched = engine.config.scheduler
    n = warm_decode_splits(engine.executor, sched.max_num_seqs, sched.max_model_len)
    reqs = loop_workload(num_requests, engine.model_config.vocab_size, sched.max_model_len, seed=1)
    recorder = RecordingExecutor(engine.executor)
    engine.executor = recorder
    t0 = time.perf_counter()
    try:
        run_workload(EngineBackend(engine), reqs, RunOptions(progress=False, id_prefix="calib"))
    finally:
        engine.executor = recorder.inner
    # loop_s: the engine loop's host time after the step, until the next one started (the
    # real engine, runner and bench loop on this machine; None after the last step)
    recs = recorder.records
    gaps = [gap for _, gap in loop_overheads(recs)] + [None]
    # launch_s: until the runner's launch returned (every kernel issued; while serving that
    # includes waiting for the GPU's queue, so not the pure issue cost `issue_s` means)
    steps = [{"shape": r.shape.to_json(), "wall_s": r.execute_s, "issue_s": None, "loop_s": g,
              "launch_s": r.issue_s}
             for r, g in zip(recs, gaps) if r.shape.num_reqs]
    log(f"serving: {num_requests} requests, {len(steps)} steps in "
        f"{time.perf_counter() - t0:.1f} s ({n} decode split variants warmed)")
    return steps


def environment() -> dict:
    env: dict[str, str | None] = {
        "command": " ".join(["kvtier profile", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(), "torch": torch.__version__}
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        env["triton"] = None
    env["git_commit"] = git_info()["commit"]  # KVTIER_GIT_COMMIT first (stale device .git)
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


# ---- CLI -----------------------------------------------------------------------------------------
def add_profile_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "profile", help="calibrate the cost model on this GPU",
        description="Measure MODEL's operators, whole steps and a short serving trace on this "
                    "GPU and write the cost model's calibration. Defaults here: --max-model-len "
                    "4096 (decode graphs pick their splits from it) and --load-format dummy "
                    "(timings do not depend on weight values).")
    EngineArgs.add_cli_args(p)
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--hardware", default="auto", help="profile name (default: from the GPU)")
    p.add_argument("--quick", action="store_true", help="tiny sweeps (smoke test)")
    p.add_argument("--serve-requests", type=int, default=200,
                   help="requests of the serving trace the host parameters are fitted to (0: "
                        "fit them to the sweep steps)")
    p.add_argument("--loop-requests", type=int, default=600,
                   help="requests of the engine-loop overhead measurement (0: skip)")
    p.set_defaults(func=run_profile, max_model_len=4096, load_format="dummy")


def run_profile(args: argparse.Namespace) -> int:
    # Synchronous steps: the host terms are fitted to each serving step's wall, launch to
    # result, which under async scheduling also spans the next step's scheduling and launch
    # (the simulator prices synchronous steps).
    eargs = replace(EngineArgs.from_cli_args(args), async_scheduling=False)
    hardware = detect_hardware() if args.hardware == "auto" else args.hardware
    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(eargs)
    print(f"engine built in {time.perf_counter() - t0:.1f} s", flush=True)
    partial = Path(args.out + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)

    def checkpoint(r: dict) -> None:
        partial.write_text(json.dumps(r))

    raw = profile_engine(engine, hardware, args.quick, lambda s: print(s, flush=True),
                         checkpoint, args.serve_requests)
    del engine
    if args.loop_requests:
        raw["loop"] = measure_loop_overhead(replace(eargs, device="cpu"), args.loop_requests)
    calib: Calibration = fit_calibration(raw, environment())
    calib.save(args.out)
    partial.unlink(missing_ok=True)
    print(json.dumps(calib.fit_report, indent=1))
    print(f"wrote {args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = argparse.ArgumentParser(prog="kvtier")
    add_profile_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["profile", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
