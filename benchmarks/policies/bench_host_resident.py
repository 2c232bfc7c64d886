"""Running requests with their KV in host memory (issue 27): NEO (CPU attention) and
DirectKV (zero-copy GPU reads) against swap and recompute, all at one capped device pool.

Every policy serves the same offline batch (N requests, --prompt tokens each, --output
tokens generated, greedy, EOS ignored) on a device pool of --gpu-blocks blocks, too small
for the batch, so requests must leave the device: preempted (swap, recompute) or run from
the host pool (neo, directkv). Per policy: output tokens/s over the whole run, TPOT (mean
over requests of (last token - first token) / (tokens - 1)), preemptions, moves; and per
step, the host rows' context tokens and the step's wall time (synchronous scheduling, so a
step's wall time is its time); neo runs with NEO's pipelining rule (`neo`: neo:auto) and
without pipelining (`neo:off`). Each step records the work it ran, and the host rows' cost
is fit over all the run's steps with the rest of the work held equal (step_fit.py: a step
with host rows may also run a prefill chunk); the fit's slope per host context token is put
beside the model `bytes / bandwidth`: for directkv every host context token's K and V
crosses PCIe once a step (kv bytes per token / the measured H2D rate), for neo it is read
by the CPU instead (the same bytes / the CPU attention's rate the simulator prices with).

  python -m benchmarks.policies.bench_host_resident --out results/policies/host_resident_h200.json
                                                       (H200, Llama-3.1-8B dummy; minutes)
  python -m benchmarks.policies.bench_host_resident --quick --device cpu
                                                       (CPU smoke run of the logic)

--simulate runs the same batch in kvtier's simulator (kvtier.sim.build_sim_engine, the
model's H200 calibration in results/calibration/, calib_h200_<model>.json): the real scheduler
and policies, each step's time the cost model's (host rows priced by the h200 profile's
fit, benchmarks/policies/fit_host_rows.py). --decide-unfitted lets the policies' rules
price with the profile less that fit (host rows at their bytes' rate alone), as they did
when the H200 runs were made, so the simulated runs make the measured runs' decisions.
A policy `name@B` sets its balance factor (--neo-cpu-balance / --directkv-balance; @0
lifts it).

  python -m benchmarks.policies.bench_host_resident --simulate --decide-unfitted \
      --neo-max-skipped-steps 0 --caps 0.5,0.75,0.9 \
      --policies neo,neo:off,directkv@0,swap,recompute,neo@1,directkv@1 \
      --out results/policies/host_resident_sim_h200.json
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from typing import Any

from benchmarks.policies.step_fit import fit_host_step, paired_host_cost, step_work

# No steady step of these batches (up to 13B, 2,176-token contexts) takes this long; a
# measured step beyond it compiled a kernel for a new shape.
ONE_OFF_S = 0.3
POLICIES = ("neo", "neo:off", "directkv", "swap", "recompute")
# directkv's modes: (engine flag, its value)
DIRECTKV_MODES = {"inline": ("directkv_side_stream", False),
                  "piecewise": ("directkv_graphs", False),
                  "partial": ("directkv_partial_moves", True),
                  "admit": ("directkv_host_admission", True)}
NEO_MODES = {"piecewise": ("neo_graphs", False),  # others: the --neo-pipeline value
             "flagged": ("neo_flagged_pipeline", True),
             "admit": ("neo_host_admission", True)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-8b", help="dummy preset or HF dir")
    p.add_argument("--device", default="cuda", help="cuda | cpu (cpu: a smoke run only)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help="kv policies; neo:on / neo:off / neo:auto set --neo-pipeline, "
                        "neo:off+piecewise adds --no-neo-graphs, neo:on+flagged "
                        "--neo-flagged-pipeline, neo:off+threads15 "
                        "--neo-cpu-threads 15, "
                        "directkv:inline runs the host rows without the side stream, "
                        "directkv:piecewise without the full-model decode graphs, "
                        "directkv:partial with --directkv-partial-moves")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--prompt", type=int, default=2048, help="prompt tokens per request")
    p.add_argument("--output", type=int, default=128, help="tokens generated per request")
    p.add_argument("--gpu-blocks", type=int, default=None,
                   help="device pool blocks (default: --caps of what the batch needs)")
    p.add_argument("--host-blocks", type=int, default=None,
                   help="host pool blocks (default: the whole batch and one request more; "
                        "long contexts may need less than that can pin)")
    p.add_argument("--caps", default="0.5",
                   help="device pools as fractions of what the batch needs, each a run of "
                        "every policy (where NEO's gain vanishes)")
    p.add_argument("--max-num-seqs", type=int, default=32)
    p.add_argument("--quick", action="store_true",
                   help="tiny-llama-gqa, 8 requests of 90 + 40 tokens")
    p.add_argument("--simulate", action="store_true",
                   help="run in kvtier's simulator (the H200 profile and calibration)")
    p.add_argument("--hardware", default="h200", help="--simulate: the simulated GPU")
    p.add_argument("--calibration", default=None,
                   help="--simulate: calibration JSON (default: the model's H200 one, if any)")
    p.add_argument("--decide-unfitted", action="store_true",
                   help="--simulate: the policies' rules price host rows without the "
                        "profile's fit (as the measured runs did)")
    p.add_argument("--no-host-fit", action="store_true",
                   help="--simulate: host rows priced without the profile's fit, at their "
                        "bytes' rate alone (what the fixed cost costs)")
    p.add_argument("--neo-max-skipped-steps", type=int, default=None,
                   help="neo's GPU-only steps bound (default: the engine's)")
    p.add_argument("--compare", default=None,
                   help="--simulate: a measured result JSON; each row gets the measured "
                        "tokens/s of the same policy and cap (`name@0` matched to `name` "
                        "when the measured file has no such row)")
    p.add_argument("--out", default=None, help="result JSON (benchmarks/common.write_result)")
    args = p.parse_args(argv)
    if args.quick:
        args.model, args.requests, args.prompt, args.output = "tiny-llama-gqa", 8, 90, 40
    return args


def pool_sizes(args: argparse.Namespace, cap: float = 0.5) -> tuple[int, int, int]:
    """(device blocks, host blocks, layer groups): the device pool holds `cap` of the batch
    unless --gpu-blocks says otherwise; the host pool holds all of it unless --host-blocks
    says otherwise."""
    from kvtier.kv.manager import cdiv
    from kvtier.model.loader import resolve_model_config

    mc, _ = resolve_model_config(args.model, "dummy")
    groups = cdiv(mc.num_layers, min(4, mc.num_layers))
    per_request = groups * cdiv(args.prompt + args.output, 16)
    need = args.requests * per_request
    return (args.gpu_blocks or int(need * cap), args.host_blocks or need + per_request,
            groups)


def policy_flags(args: argparse.Namespace, policy: str) -> tuple[str, dict[str, Any]]:
    """`name[:mode][@balance]` -> (--kv-policy, its engine flags); the mode is neo's
    --neo-pipeline and/or `piecewise` (--no-neo-graphs), `threadsN` (--neo-cpu-threads N),
    `flagged` (--neo-flagged-pipeline), or directkv's `inline`
    (--no-directkv-side-stream), `piecewise` (--no-directkv-graphs), `partial`
    (--directkv-partial-moves); for either, `admit` (--<system>-host-admission: prompts
    the device cannot take are admitted past it); several joined by `+` (e.g. `neo:off+piecewise`)."""
    spec, _, balance = policy.partition("@")
    name, _, mode = spec.partition(":")
    extra: dict[str, Any] = {}
    if mode and name == "directkv":
        extra = dict(DIRECTKV_MODES[m] for m in mode.split("+"))
    elif mode:
        extra = dict(_neo_mode(m) for m in mode.split("+"))
    if balance:
        extra[{"neo": "neo_cpu_balance", "directkv": "directkv_balance"}[name]] = float(balance)
    if name == "neo" and args.neo_max_skipped_steps is not None:
        extra["neo_max_skipped_steps"] = args.neo_max_skipped_steps
    return name, extra


def _neo_mode(mode: str) -> tuple[str, Any]:
    """neo's `piecewise`, `threadsN` (--neo-cpu-threads N), else a --neo-pipeline value."""
    if mode.startswith("threads"):
        return "neo_cpu_threads", int(mode.removeprefix("threads"))
    return NEO_MODES.get(mode, ("neo_pipeline", mode))


def make_engine(args: argparse.Namespace, engine_args: Any) -> tuple[Any, Any]:
    """(engine, its clock): the real engine on the wall clock, or the simulated one on its
    virtual clock (each step's predicted time)."""
    if not args.simulate:
        from kvtier.engine.llm_engine import LLMEngine

        return LLMEngine.from_engine_args(engine_args), time.perf_counter
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.sim.clock import VirtualClock
    from kvtier.sim.engine import build_sim_engine

    hw = get_hardware(args.hardware)
    calib = args.calibration or (os.path.join("results", "calibration",
                                              f"calib_h200_{args.model}.json")
                                 if hw.name == "h200" else "")
    unfitted = dataclasses.replace(hw, host_attention={})
    clock = VirtualClock()
    engine = build_sim_engine(
        dataclasses.replace(engine_args, device="auto"), unfitted if args.no_host_fit else hw,
        calib if calib and os.path.exists(calib) else None, clock=clock,
        planner_hardware=unfitted if args.decide_unfitted else None)
    return engine, clock.now


class StepLog:
    """Wraps the executor: each step's time on `now` and the work it ran (step_fit.step_work)."""

    def __init__(self, inner: Any, now: Any = time.perf_counter):
        self.inner, self.steps, self.now = inner, [], now

    def execute(self, plan):
        work = step_work(plan)
        t0 = self.now()
        result = self.inner.execute(plan)
        self.steps.append({**work, "step_s": self.now() - t0})
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def run_policy(args: argparse.Namespace, policy: str, cap: float) -> dict[str, Any]:
    from kvtier.engine.args import EngineArgs
    from kvtier.sampling_params import SamplingParams

    gpu_blocks, host_blocks, _ = pool_sizes(args, cap)
    name, extra = policy_flags(args, policy)
    engine_args = EngineArgs(
        model=args.model, load_format="dummy", device=args.device, kv_policy=name, **extra,
        num_gpu_blocks=gpu_blocks, num_host_blocks=host_blocks,
        max_model_len=args.prompt + args.output, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=max(2048, args.prompt), async_scheduling=False)
    engine, now = make_engine(args, engine_args)
    log = StepLog(engine.executor, now)
    engine.executor = log
    params = SamplingParams(temperature=0.0, max_tokens=args.output, ignore_eos=True,
                            detokenize=False)
    for i in range(args.requests):
        engine.add_request(f"r{i}", [100 + (i * 7919 + t) % 3000 for t in range(args.prompt)],
                           params)
    times: dict[str, list[float]] = {}
    t0 = now()
    while engine.has_unfinished_requests():
        engine.step()
        t = now()
        for req in engine.scheduler.running:
            times.setdefault(req.request_id, []).append(t)
    wall = now() - t0
    placement = engine.scheduler.policy
    stats = engine.get_stats()
    engine.close()
    run = {"policy": policy, "cap": cap, "gpu_blocks": gpu_blocks, "wall_s": wall,
           "output_tokens_per_s": args.requests * args.output / wall}
    return {**run, "output_tokens_per_s_without_one_offs": without_one_offs(run, log.steps),
            "tpot_ms": 1e3 * tpot(times), "steps": log.steps,
            "num_preemptions": stats.num_preemptions_total,
            "moved_out": getattr(placement, "num_moved_out", None),
            "moved_out_for_prompts": getattr(placement, "num_moved_for_prompts", None),
            "moved_in": getattr(placement, "num_moved_in", None),
            "refused": getattr(placement, "num_refused", None),
            "refused_by_system": getattr(placement, "num_refused_by_system", None),
            "pipelined_steps": getattr(placement, "num_pipelined_steps", None),
            "gpu_only_steps": getattr(placement, "num_gpu_only_steps", None),
            "partly_held_steps": getattr(placement, "num_partly_held_steps", None),
            "host_fit": fit_host_step(log.steps, model_rates(args)["kv_bytes_per_token"])}


def without_one_offs(run: dict[str, Any], steps: list[dict[str, Any]]) -> float:
    """Output tokens/s with the steps over ONE_OFF_S left out: a kernel compiling for a new
    shape, paid by whichever run of the process meets the shape first (and not priced by the
    simulator)."""
    slow = sum(x["step_s"] for x in steps if x["step_s"] > ONE_OFF_S)
    return run["output_tokens_per_s"] * run["wall_s"] / (run["wall_s"] - slow)


def tpot(times: dict[str, list[float]]) -> float:
    """Mean over requests of the gaps between the steps that ran them (seconds)."""
    gaps = [(t[-1] - t[0]) / (len(t) - 1) for t in times.values() if len(t) > 1]
    return statistics.fmean(gaps) if gaps else 0.0


def pair_with_device_runs(rows: list[dict[str, Any]], kv_bytes_per_token: int) -> None:
    """Adds `host_paired` to each run with host rows: its steps against those of every run
    of the same cap that kept all rows on the device (step_fit.paired_host_cost)."""
    for row in rows:
        if not row.get("host_fit"):
            continue
        row["host_paired"] = {
            b["policy"]: paired_host_cost(row["steps"], b["steps"], kv_bytes_per_token)
            for b in rows if b["cap"] == row["cap"] and "steps" in b
            and not any(s["host_context_tokens"] for s in b["steps"])}


def model_rates(args: argparse.Namespace) -> dict[str, float]:
    """The bytes / bandwidth model of one host context token's attention, per mechanism."""
    from benchmarks.common import H200_PCIE_BYTES_PER_S
    from kvtier.model.loader import resolve_model_config
    from kvtier.policies.neo import CPU_ATTENTION_BYTES_PER_S

    mc, _ = resolve_model_config(args.model, "dummy")
    per_token = mc.kv_bytes_per_token(2)
    return {"kv_bytes_per_token": per_token,
            "directkv_seconds_per_host_token": per_token / H200_PCIE_BYTES_PER_S,
            "neo_seconds_per_host_token": per_token / CPU_ATTENTION_BYTES_PER_S}


def run_guarded(args: argparse.Namespace, policy: str, cap: float) -> dict[str, Any]:
    """One run; a policy that fails is recorded with its error and the sweep goes on."""
    try:
        row = run_policy(args, policy, cap)
    except Exception as exc:  # noqa: BLE001 - the error is the row's result
        print(f"{policy:10s} cap {cap}: {type(exc).__name__}: {exc}")
        return {"policy": policy, "cap": cap, "error": f"{type(exc).__name__}: {exc}"}
    print(f"{policy:10s} cap {cap}: {row['output_tokens_per_s']:9.1f} tok/s "
          f"({row['output_tokens_per_s_without_one_offs']:.1f} without one-off steps)  TPOT "
          f"{row['tpot_ms']:7.2f} ms  preemptions {row['num_preemptions']}  "
          f"pipelined {row['pipelined_steps']}  gpu-only {row['gpu_only_steps']}  fit {row['host_fit']}")
    return row


def compare(rows: list[dict[str, Any]], path: str) -> None:
    """Adds `measured_tokens_per_s` (and the measured moves) to each row from `path`."""
    import json

    with open(path) as f:
        measured = {(r["policy"], r["cap"]): r for r in json.load(f)["policies"]
                    if "error" not in r}
    for row in rows:
        key = (row["policy"], row["cap"])
        if key not in measured and row["policy"].endswith("@0"):
            key = (row["policy"][:-2], row["cap"])
        if key in measured and "error" not in row:
            m = measured[key]
            row["measured_as"], row["measured_tokens_per_s"] = key[0], m["output_tokens_per_s"]
            row["measured_moved_out"] = m["moved_out"]
            row["measured_tokens_per_s_without_one_offs"] = without_one_offs(m, m["steps"])
            print(f"{row['policy']:12s} cap {row['cap']}: simulated "
                  f"{row['output_tokens_per_s']:7.1f} tok/s, measured "
                  f"{m['output_tokens_per_s']:7.1f} ({key[0]}; without one-off steps "
                  f"{row['measured_tokens_per_s_without_one_offs']:7.1f}); moves out {row['moved_out']} "
                  f"vs {m['moved_out']}")


def main(argv: list[str] | None = None) -> None:
    from benchmarks.common import write_result

    args = parse_args(argv)
    caps = [float(c) for c in args.caps.split(",")]
    _, host_blocks, groups = pool_sizes(args)
    rows = [run_guarded(args, policy, cap)
            for cap in caps for policy in args.policies.split(",")]
    if args.compare:
        compare(rows, args.compare)
    pair_with_device_runs(rows, model_rates(args)["kv_bytes_per_token"])
    payload = {"model": args.model, "simulated": args.simulate and {
                   "hardware": args.hardware, "decide_unfitted": args.decide_unfitted,
                   "no_host_fit": args.no_host_fit},
               "requests": args.requests, "prompt": args.prompt,
               "output": args.output, "caps": caps, "host_blocks": host_blocks,
               "layer_groups": groups, "model_rates": model_rates(args), "policies": rows}
    if args.out:
        write_result(args.out, payload)
        if any("error" in r for r in rows):
            sys.exit(1)


if __name__ == "__main__":
    main()
