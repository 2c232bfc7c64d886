"""Where running requests from host memory would pay against swap, by kvtier's cost model
(issue 27): bench_host_resident's batch in the simulator over prompt lengths, output
lengths, device-pool caps and GPUs. Per setting: tokens/s of swap and recompute, and the gain
over the better of the two of NEO and DirectKV, both with their balances lifted (`@0`: every overflowing decode runs from the
host, what the mechanism costs when it is used) and with them (the default: a move is made
only where the system's rule says it pays, kvtier/policies/host_resident/balance.py).

The H200 rows price host rows with the profile's fit (results/calibration/host_rows_h200.json),
`h200-bytes` the same GPU with host rows at their bytes' rate alone (no per-layer fixed
cost: what an implementation without it would reach); the other GPUs' profiles are datasheet
figures with host rows at their bytes' rate, uncalibrated.

  python -m benchmarks.sim.sim_host_resident_payoff --out results/sim/host_resident_payoff_sim.json
"""

from __future__ import annotations

import argparse
import itertools

from benchmarks.common import write_result
from benchmarks.policies import bench_host_resident as bench

POLICIES = ("swap", "recompute", "neo@0", "directkv@0", "neo", "directkv")
HOST_RESIDENT = ("neo@0", "directkv@0", "neo", "directkv")


def settings(args: argparse.Namespace):
    return itertools.product(args.hardware.split(","), [int(x) for x in args.prompts.split(",")],
                             [int(x) for x in args.outputs.split(",")],
                             [float(x) for x in args.caps.split(",")])


def run_setting(args: argparse.Namespace, hardware: str, prompt: int, output: int,
                cap: float) -> dict:
    no_fit = hardware.endswith("-bytes")
    argv = ["--simulate", "--hardware", hardware.removesuffix("-bytes"), "--model", args.model,
            "--requests", str(args.requests), "--prompt", str(prompt), "--output", str(output)]
    bargs = bench.parse_args(argv + (["--no-host-fit"] if no_fit else []))
    rows = {p: bench.run_guarded(bargs, p, cap) for p in POLICIES}
    rate = {p: r.get("output_tokens_per_s") for p, r in rows.items()}
    best = max((rate[p] for p in ("swap", "recompute") if rate[p]), default=None)
    gain = {p: (rate[p] / best - 1 if rate[p] and best else None) for p in HOST_RESIDENT}
    return {"hardware": hardware, "prompt": prompt, "output": output, "cap": cap,
            "tokens_per_s": rate, "gain_vs_best_preemption": gain,
            "moved_out": {p: rows[p].get("moved_out") for p in HOST_RESIDENT},
            "errors": {p: r["error"] for p, r in rows.items() if "error" in r}}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--model", default="llama-3.1-8b")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--hardware", default="h200,h200-bytes,h100-sxm,a100")
    p.add_argument("--prompts", default="1024,4096,16384")
    p.add_argument("--outputs", default="16,128")
    p.add_argument("--caps", default="0.5,0.9")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    rows = [run_setting(args, *s) for s in settings(args)]
    for r in rows:
        g = "  ".join(f"{k} {v:+.0%}" if v is not None else f"{k} -"
                      for k, v in r["gain_vs_best_preemption"].items())
        t = r["tokens_per_s"]
        print(f"{r['hardware']:10s} prompt {r['prompt']:6d} out {r['output']:4d} cap {r['cap']}: "
              f"swap {t['swap'] or 0:7.1f} recompute {t['recompute'] or 0:7.1f} tok/s  {g}  "
              f"moves {r['moved_out']}")
    if args.out:
        write_result(args.out, {"model": args.model, "requests": args.requests,
                                "settings": rows})


if __name__ == "__main__":
    main()
