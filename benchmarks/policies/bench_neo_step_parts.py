"""Where a NEO step with host rows spends its wall time in the engine, by part: the same
batch as bench_host_resident (its flags; default Llama-3.1-8B, 32 x 2,048 + 128 at 3/4 of the
batch, `neo:off@0`: every host step sequential), with timers around NEO's runner side:

  - `hook_ms`: the attention hook for the host rows (`HostRowsAttention.forward`), all layers;
    of it `submit_ms` (rotary aside: the q/k/v copy down, its wait for the GPU, the job's
    hand-over; `StepLayers.submit`) and `wait_ms` (the CPU job's wait; its result);
  - `rest_ms`: the step's wall time outside the hook (the GPU work and the Python that
    launches it, run one after the other with the hook in a sequential step);
  - steps replayed as a decode graph (no hook: one CPU job follows the graph's layers,
    kvtier/kernels/cpu_attention_step.py) split by the job's own timestamps instead:
    `job_cpu_ms` its layers' work (rows seen to done flag raised, all layers),
    `job_first_ms` from its start to layer 0's rows, `job_between_ms` from each layer's
    done flag to the next layer's rows (the GPU's work between, and the flags' trips).

Per host step the medians, beside the median decode step without host rows. The timers
cost a few µs a layer.

`python -m benchmarks.policies.bench_neo_step_parts --caps 0.75 --policies neo:off@0 --out ...`
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import write_result  # noqa: E402
from benchmarks.policies import bench_host_resident as bhr  # noqa: E402
from kvtier.kernels import cpu_attention_layers as layers  # noqa: E402
from kvtier.policies.host_resident.runner_side import HostRowsAttention  # noqa: E402

PARTS = ("hook", "submit", "wait", "job_cpu", "job_first", "job_between")
spent = dict.fromkeys(PARTS, 0.0)


def timed(part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - t
    return wrapper


def install() -> None:
    """The timers, and each step's sums added to its StepLog record."""
    HostRowsAttention.forward = timed("hook", HostRowsAttention.forward)  # type: ignore[method-assign]
    layers.StepLayers.submit = timed("submit", layers.StepLayers.submit)  # type: ignore[method-assign]
    layers._NativePending.result = timed("wait", layers._NativePending.result)  # type: ignore[method-assign]
    from kvtier.policies.neo.graph_rows import GraphSteps

    begin, end = GraphSteps.begin, GraphSteps.end
    started = [0]

    def timed_begin(self: Any) -> None:
        started[0] = time.monotonic_ns()
        begin(self)

    def timed_end(self: Any, failed: bool) -> None:
        end(self, failed)
        if not failed:
            for part, seconds in self.handoff.layer_times(started[0]).items():
                spent[f"job_{part}"] += seconds
    GraphSteps.begin, GraphSteps.end = timed_begin, timed_end  # type: ignore[method-assign]
    execute = bhr.StepLog.execute

    def logged(self: Any, plan: Any) -> Any:
        for part in PARTS:
            spent[part] = 0.0
        out = execute(self, plan)
        self.steps[-1].update({f"{p}_s": spent[p] for p in PARTS})
        return out
    bhr.StepLog.execute = logged  # type: ignore[method-assign]


def summary(run: dict[str, Any]) -> dict[str, Any]:
    steps = run.get("steps", [])
    host = [s for s in steps if s["host_context_tokens"] and not s["prefill_tokens"]][2:]
    plain = [s["step_s"] for s in steps
             if not s["host_context_tokens"] and not s["prefill_tokens"] and s["num_scheduled"] > 1]
    if not host:
        return {"host_steps": 0}

    def med(key: str) -> float:
        return round(1e3 * statistics.median(s[key] for s in host), 3)
    rest = [s["step_s"] - s["hook_s"] for s in host]
    return {"host_steps": len(host), "host_rows": statistics.median(s["host_rows"] for s in host),
            "step_ms": med("step_s"), "hook_ms": med("hook_s"), "submit_ms": med("submit_s"),
            "wait_ms": med("wait_s"), "rest_ms": round(1e3 * statistics.median(rest), 3),
            "job_cpu_ms": med("job_cpu_s"), "job_first_ms": med("job_first_s"),
            "job_between_ms": med("job_between_s"),
            "decode_step_without_host_rows_ms":
                round(1e3 * statistics.median(plain), 3) if plain else None}


def main() -> None:
    args = bhr.parse_args()
    install()
    rows = []
    for cap in (float(c) for c in args.caps.split(",")):
        for policy in args.policies.split(","):
            run = bhr.run_guarded(args, policy, cap)
            rows.append({"policy": policy, "cap": cap,
                         "output_tokens_per_s": run.get("output_tokens_per_s"), **summary(run)})
            print(rows[-1])
    if args.out:
        write_result(args.out, {"model": args.model, "requests": args.requests,
                                "prompt": args.prompt, "output": args.output, "runs": rows})


if __name__ == "__main__":
    main()
