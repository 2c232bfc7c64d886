"""A second fidelity check on a real `kvtier bench` run someone else made: replay its trace
(prompt lengths, output lengths, arrival times from requests_<policy>.csv) in the simulator
with the run's engine configuration and compare the figures and engine counters, per KV
policy. Nothing of that run went into the calibration, so every figure is out of sample.

  python -m benchmarks.fidelity.fidelity_bench results/serving/bench_13b_sharegpt_h200 \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --host-from results/fidelity/fidelity_h200.json \
      --out results/fidelity/fidelity_h200_bench13b.json

`--host-from` adds a second simulation whose host terms are the ones fitted to the fidelity
run's serving steps (`diagnostic_serving_host_fit` of fidelity_h200.json): a different run,
so still out of sample here.
"""

from __future__ import annotations

import argparse
import csv
import json
import random
from dataclasses import fields, replace
from pathlib import Path

from benchmarks.common import write_result
from benchmarks.fidelity.fidelity_scoring import summary_errors
from kvtier.bench.engine_backend import EngineBackend
from kvtier.bench.metrics import engine_summary, summarize_run
from kvtier.bench.request import BenchRequest
from kvtier.bench.runner import RunOptions, run_workload
from kvtier.costmodel.calibration import Calibration, HostParams
from kvtier.engine.args import EngineArgs
from kvtier.sim import VirtualClock, build_sim_engine

COUNTERS = ("num_preemptions", "num_swap_out_blocks", "num_swap_in_blocks",
            "num_recomputed_tokens", "num_generation_tokens", "num_steps", "mean_running")


def trace(path: Path, vocab: int, seed: int = 0) -> list[BenchRequest]:
    """The run's requests in id order: lengths and arrivals (token values do not matter to
    the simulator; random ones stand in)."""
    rng = random.Random(seed)
    rows = list(csv.DictReader(path.open()))
    rows.sort(key=lambda r: int(r["request_id"].rsplit("-", 1)[1]))
    return [BenchRequest(tuple(rng.randrange(vocab) for _ in range(int(r["prompt_len"]))),
                         int(r["expected_output_len"]), float(r["arrival_s"])) for r in rows]


def engine_args(cfg: dict, policy: str) -> EngineArgs:
    names = {f.name for f in fields(EngineArgs)}
    return replace(EngineArgs(**{k: v for k, v in cfg.items() if k in names}), kv_policy=policy)


def simulate(args: EngineArgs, calib: Calibration, reqs: list[BenchRequest], bench: dict):
    clock = VirtualClock()
    engine = build_sim_engine(args, "h200", calib, clock=clock)
    backend = EngineBackend(engine, ignore_eos=bench["ignore_eos"], clock=clock)
    options = RunOptions(progress=False, max_duration_s=bench.get("max_duration"),
                         id_prefix=args.kv_policy)
    return run_workload(backend, reqs, options, clock=clock)


def compare(real: dict, result) -> dict:
    sim_summary, sim_engine = summarize_run(result).to_dict(), engine_summary(result)
    return {"errors": summary_errors(real["summary"], sim_summary),
            "num_completed": {"real": real["summary"]["num_completed"],
                              "sim": sim_summary["num_completed"]},
            "counters": {k: {"real": real["engine"].get(k), "sim": sim_engine.get(k)}
                         for k in COUNTERS},
            "sim_summary": sim_summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run_dir")
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--host-from", help="a fidelity report whose serving host fit to try too")
    ap.add_argument("--policies", default="recompute,swap")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    run = Path(args.run_dir)
    result = json.loads((run / "result.json").read_text())
    cfg, bench = result["config"]["engine"], result["config"]["bench"]
    calibs = {"profile": Calibration.load(args.calibration)}
    if args.host_from:
        host = json.loads(Path(args.host_from).read_text())["diagnostic_serving_host_fit"]["host"]
        calibs["serving_host"] = replace(calibs["profile"], host=HostParams(**host))
    report: dict = {"real_run": str(run / "result.json"), "real_command": result["command"],
                    "real_git": result.get("git"), "calibration": args.calibration,
                    "engine": cfg, "policies": {}}
    for policy in args.policies.split(","):
        real = result["policies"][policy]
        eargs = engine_args(cfg, policy)
        reqs = trace(run / f"requests_{policy}.csv", 32000)
        report["policies"][policy] = {
            name: compare(real, simulate(eargs, calib, reqs, bench))
            for name, calib in calibs.items()}
        for name, r in report["policies"][policy].items():
            e = r["errors"]
            print(f"{policy:>9} [{name}]: throughput {e['request_throughput']:+.1%}, TTFT p50 "
                  f"{e['ttft_p50']:+.1%}, TPOT p50 {e['tpot_p50']:+.1%}, preemptions "
                  f"{r['counters']['num_preemptions']}")
    write_result(args.out, report)


if __name__ == "__main__":
    main()
