"""Where a step's time goes: torch.profiler over a window of the offline ShareGPT run.

Writes a summary JSON: per profiled step its wall time, kind (mixed / decode-only), tokens,
the GPU's busy time (union of kernel intervals) and the top kernels, plus the top CPU ops.

  python -m benchmarks.offline.profile_offline_steps --workload .carry/sharegpt_llama31_1000.json \
      --skip 40 --steps 40 --out profile_offline_h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks.common import write_result
from kvtier import LLM, SamplingParams


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if s > end:
            total += e - s
            end = e
        elif e > end:
            total += e - end
            end = e
    return total


def device_kernels(events) -> list:
    """GPU-side events minus the step ranges' own GPU annotations (`record_function` shows
    up on the device timeline too, spanning the whole step)."""
    return [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
            and not (e.name.startswith("step") and e.name[4:].isdigit())]


def summarize(events, windows: list[dict]) -> list[dict]:
    """Attribute every kernel to the step whose window it started in: a step ends by
    reading its sampled tokens back, so its kernels are done before the next one starts."""
    kernels = device_kernels(events)
    out = []
    for w in windows:
        ks = [k for k in kernels if w["t0"] <= k.time_range.start < w["t1"]]
        w = dict(w)
        by_name: dict[str, float] = defaultdict(float)
        for k in ks:
            by_name[k.name[:80]] += k.time_range.elapsed_us()
        w["kernels"] = len(ks)
        w["kernel_sum_us"] = sum(by_name.values())
        w["top"] = sorted(by_name.items(), key=lambda x: -x[1])[:12]
        out.append(w)
    return out


def python_profile(engine, args) -> None:
    """cProfile over the window: where the host's time goes, per Python function."""
    import cProfile
    import io
    import pstats

    walls = []
    prof = cProfile.Profile()
    for _ in range(args.steps):
        t0 = time.perf_counter()
        prof.enable()
        engine.step()
        prof.disable()
        st = engine.get_stats()
        walls.append((1e3 * (time.perf_counter() - t0), st.num_scheduled_requests,
                      st.num_scheduled_tokens))
    tables = {}
    for key in ("tottime", "cumtime"):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(45)
        tables[key] = buf.getvalue()
        print(tables[key])
    print(walls)
    write_result(args.out, {"options": vars(args), "steps": walls, **tables})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--skip", type=int, default=40)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--piecewise-graphs", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--max-num-seqs", type=int, default=512)
    ap.add_argument("--max-num-batched-tokens", type=int, default=8192)
    ap.add_argument("--max-graph-batch-size", type=int, default=512)
    ap.add_argument("--cprofile", action="store_true",
                    help="Python profile of the window (cProfile) instead of torch.profiler")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    reqs = json.load(open(args.workload))["requests"]
    llm = LLM(args.model, load_format="dummy", dtype="bfloat16", max_model_len=4096,
              max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
              max_graph_batch_size=args.max_graph_batch_size, layers_per_block=4, swap_space=1,
              gpu_memory_utilization=0.9, piecewise_graphs=args.piecewise_graphs)
    engine = llm.engine
    for i, (prompt, out) in enumerate(reqs):
        engine.add_request(str(i), prompt, SamplingParams(
            temperature=0.0, max_tokens=out, ignore_eos=True, detokenize=False,
            output_kind="final_only"))
    for _ in range(args.skip):
        engine.step()
    torch.cuda.synchronize()
    if args.cprofile:
        python_profile(engine, args)
        return
    windows = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(args.steps):
            t0 = time.perf_counter()
            with record_function(f"step{i}"):
                engine.step()
            st = engine.get_stats()
            windows.append({"step": i, "wall_ms": 1e3 * (time.perf_counter() - t0),
                            "reqs": st.num_scheduled_requests,
                            "tokens": st.num_scheduled_tokens})
    events = prof.events()
    ranges = {e.name: e for e in events if e.name.startswith("step") and e.name[4:].isdigit()}
    for w in windows:
        r = ranges[f"step{w['step']}"]
        w["t0"], w["t1"] = r.time_range.start, r.time_range.end
        w["mixed"] = w["tokens"] > w["reqs"]
    kern = device_kernels(events)
    for w in windows:
        ks = [(k.time_range.start, k.time_range.end) for k in kern
              if w["t0"] <= k.time_range.start < w["t1"]]
        w["gpu_busy_ms"] = busy_us(ks) / 1e3
    steps = summarize(events, windows)
    cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40)
    gpu = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=40)
    print(gpu)
    print(cpu)
    for s in steps:
        print(s["step"], s["mixed"], s["reqs"], s["tokens"], round(s["wall_ms"], 2),
              round(s["gpu_busy_ms"], 2), s["kernels"])
    write_result(args.out, {"options": vars(args), "steps": steps,
                            "cpu_table": cpu, "gpu_table": gpu})


if __name__ == "__main__":
    main()
