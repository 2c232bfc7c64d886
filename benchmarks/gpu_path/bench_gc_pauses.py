"""Python garbage-collector pauses inside a serving run, with and without `gc.freeze()`
after start-up (what `build_engine` now does, as vLLM does after its init).

A gen-2 collection walks every tracked object, the start-up ones too (torch, the model,
the engine); a pause inside a step whose launches the GPU waits on (a mixed step's graph
pieces and eager attention) idles the GPU for its length. The run is the simulated 13B
fidelity trace, on the CPU, so the engine's own objects are what the collector sees; each
mode runs in a fresh interpreter.

  python -m benchmarks.gpu_path.bench_gc_pauses \
      --real results/fidelity/fidelity_real_h200.json \
      --calibration results/calibration/calib_h200_llama-2-13b.json \
      --out results/gpu_path/gc_pauses_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

from benchmarks.common import write_result


def measure(real_path: str, calib_path: str, freeze: bool) -> dict:
    from benchmarks.fidelity.fidelity_trace import simulate
    from kvtier.costmodel.calibration import Calibration

    real = json.load(open(real_path))
    calib = Calibration.load(calib_path)
    # Only pauses after start-up count (the builder's own gc.collect() is not serving).
    pauses: list[tuple[int, float]] = []
    started: dict[str, float] = {}
    real_freeze = gc.freeze

    def built() -> None:
        pauses.clear()
        if freeze:  # the baseline: the builders' gc.freeze() does nothing
            real_freeze()

    gc.freeze = built

    def timer(phase: str, info: dict) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
        else:
            pauses.append((info["generation"], time.perf_counter() - started["t"]))

    gc.callbacks.append(timer)
    t0 = time.perf_counter()
    simulate(real, calib)
    wall = time.perf_counter() - t0
    gc.callbacks.remove(timer)
    out: dict = {"freeze": freeze, "wall_s": wall, "tracked_objects_after": len(gc.get_objects())}
    for gen in (0, 1, 2):
        d = sorted(p for g, p in pauses if g == gen)
        out[f"gen{gen}"] = {"count": len(d), "max_ms": 1e3 * d[-1] if d else 0.0,
                            "median_ms": 1e3 * d[len(d) // 2] if d else 0.0,
                            "total_ms": 1e3 * sum(d)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--real", required=True)
    ap.add_argument("--calibration", required=True)
    ap.add_argument("--out")
    ap.add_argument("--mode", choices=["freeze", "plain"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode:  # one measurement, in this fresh interpreter
        print(json.dumps(measure(args.real, args.calibration, args.mode == "freeze")))
        return
    rows = []
    for mode in ("plain", "freeze"):
        run = subprocess.run([sys.executable, __file__, "--real", args.real, "--calibration",
                              args.calibration, "--mode", mode],
                             check=True, capture_output=True, text=True)
        rows.append(json.loads(run.stdout.strip().splitlines()[-1]))
        print(rows[-1])
    if args.out:
        write_result(args.out, {"benchmark": "gc_pauses", "real": args.real,
                                "calibration": args.calibration, "runs": rows})


if __name__ == "__main__":
    main()
