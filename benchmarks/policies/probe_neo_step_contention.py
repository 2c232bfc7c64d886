"""Does one more busy thread slow NEO's CPU layer calls? A step's CPU job (the one that
follows a replayed decode graph, kvtier/kernels/cpu_attention_step.py) run on the host
alone, a Python thread in the GPU's place handing each layer over after `--gap-us` (the
GPU's part between layers) and sleeping, not spinning, while it waits; beside it, or not,
`--spinners` processes that each keep a core busy, as the engine's main thread does while
it waits for the GPU (CUDA's default sync spins). Per variant (CPU threads x spinners)
the median over steps of each layer's CPU time (rows seen to done flag, the job's own
stamps), against the KV bytes a layer reads.

The question it answers: on the H200 host a one-row graph step's layer call took 0.64 ms
where its reads take ~0.14 ms at 60 GB/s (results/policies/neo_step_parts_graphs_h200_ad148d8.json);
an OpenMP team that fills every core loses a thread to a busy main thread at each region's
barrier. Defaults: Llama-3.1-8B's layer (32 query heads, 8 KV heads, head_dim 128, bf16,
16-token pages), 1 row of 2,048 tokens, 32 layers, 20 steps.

    python -m benchmarks.policies.probe_neo_step_contention --out neo_step_contention.json
    python -m benchmarks.policies.probe_neo_step_contention --threads 16,15 --spinners 0,1 --out ...
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import write_result  # noqa: E402
from kvtier.kernels.cpu_attention_layers import CpuLayerWorker  # noqa: E402
from kvtier.kernels.cpu_attention_step import Handoff, native_steps, submit_step  # noqa: E402

HQ, HKV, D, BS = 32, 8, 128, 16
SPIN = "while True: pass"


def host_pool(rows: int, context: int, layers: int, seed: int = 0):
    """Pages [P, L, 2, Hkv, bs, D] bf16 with each row's blocks scattered over a pool twice
    their size; tables [1, n, W], slots [1, n], lens [n] (all layers in one group)."""
    gen = torch.Generator().manual_seed(seed)
    width = -(-context // BS)
    num_pages = 2 * rows * width
    pages = torch.randn(num_pages, layers, 2, HKV, BS, D, generator=gen).to(torch.bfloat16)
    ids = torch.randperm(num_pages, generator=gen)[: rows * width]
    tables = ids.view(1, rows, width).to(torch.int32).contiguous()
    lens = torch.full((rows,), context, dtype=torch.int32)
    last = lens.long() - 1
    slots = (tables[:, torch.arange(rows), last // BS].long() * BS + last % BS).contiguous()
    return pages, tables, slots, lens


def play_gpu(handoff: Handoff, rows: int, epoch: int, gap_s: float) -> None:
    """Each layer's rows out after `gap_s`, its ready flag, then a sleeping wait for done."""
    for layer in range(handoff.num_layers):
        time.sleep(gap_s)
        handoff.qkv[layer, :rows].normal_()
        handoff.flags[0, layer] = epoch
        while int(handoff.flags[1, layer]) not in (epoch, -epoch):
            time.sleep(50e-6)


def run_steps(worker, pool, rows: int, threads: int, steps: int, gap_s: float) -> list[float]:
    """Every layer's CPU seconds over `steps` steps (the first step left out: warm-up)."""
    pages, tables, slots, lens = pool
    layers = pages.shape[1]
    handoff = Handoff(layers, rows, HQ, HKV, D, torch.bfloat16, pinned=False)
    per_layer = []
    for step in range(steps + 1):
        epoch = handoff.next_epoch()
        job = submit_step(worker, handoff, pages, layers, tables, slots, lens, D**-0.5,
                          num_threads=threads, epoch=epoch, timeout_s=60.0)
        gpu = threading.Thread(target=play_gpu, args=(handoff, rows, epoch, gap_s))
        gpu.start()
        gpu.join()
        job.wait()
        if step:
            times = handoff.times.double()
            per_layer += ((times[:, 1] - times[:, 0]) * 1e-9).tolist()
    return per_layer


def variant(worker, pool, rows: int, threads: int, spinners: int, steps: int, gap_s: float):
    procs = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(spinners)]
    try:
        time.sleep(0.2 if spinners else 0)
        layer_s = run_steps(worker, pool, rows, threads, steps, gap_s)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    pages, _, _, lens = pool
    read = int(lens.sum()) * 2 * HKV * D * pages.element_size()  # K and V of one layer
    med = statistics.median(layer_s)
    return {"threads": threads, "spinners": spinners, "layer_ms_median": med * 1e3,
            "layer_ms_p90": statistics.quantiles(layer_s, n=10)[-1] * 1e3,
            "layer_bytes": read, "gb_per_s": read / med / 1e9, "num_layers_timed": len(layer_s)}


def main() -> None:
    cores = os.cpu_count() or 1
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1)
    p.add_argument("--context", type=int, default=2048)
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--gap-us", type=float, default=140.0, help="the GPU's part between layers")
    p.add_argument("--threads", default=f"{cores},{max(1, cores - 1)}",
                   help="CPU attention threads to try (default: every core, and one fewer)")
    p.add_argument("--spinners", default="0,1", help="busy processes beside the job to try")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    worker = CpuLayerWorker()
    if not native_steps(worker, D):
        sys.exit("the CPU attention kernel is not built here (no compiler?)")
    pool = host_pool(args.rows, args.context, args.layers)
    rows = []
    for spinners in (int(s) for s in args.spinners.split(",")):
        for threads in (int(t) for t in args.threads.split(",")):
            r = variant(worker, pool, args.rows, threads, spinners, args.steps, args.gap_us * 1e-6)
            print(f"threads {threads:>2} spinners {spinners}: layer {r['layer_ms_median']:.3f} ms "
                  f"(p90 {r['layer_ms_p90']:.3f}), {r['gb_per_s']:.1f} GB/s")
            rows.append(r)
    worker.close()
    write_result(args.out, {"cores": cores, "rows": args.rows, "context": args.context,
                            "layers": args.layers, "steps": args.steps, "gap_us": args.gap_us,
                            "variants": rows})


if __name__ == "__main__":
    main()
