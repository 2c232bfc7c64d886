"""What NEO's host rows cost a layer inside a GPU step, by part, and what the host's threads
do to it (the H200 fit prices them at a fixed cost a layer several times their reads).

A stand-in step on the GPU: `--layers` layers of Llama-3.1-8B's linear layers (bf16, `--batch`
rows; no device attention), whose leading `--rows` rows attend over `--context` tokens of
pinned host pages through NEO's own `CpuRows` (kvtier/policies/neo/runner_side.py) each layer:

  - `gpu_only`: the stand-in without host rows;
  - `sequential`: `CpuRows.forward` a layer (the step waits for the CPU, as NEO's
    non-pipelined steps do);
  - `pipelined`: `CpuRows.submit`, the other rows' layer launched, then the result, in
    `pipelined_forward`'s order;

each the median step of `--steps`, and, with the GPU idle, the median of each part alone:
a layer's whole call from GPU q/k/v and from host ones (copy down, KV write and attention on
the kernel's thread, the wait), the kernel's wrapper alone on the main thread, the output's
copy back.

Each variant runs in a process of its own (OpenMP reads its environment once, at start):
`default`, `passive` (OMP_WAIT_POLICY=PASSIVE: the kernel's threads sleep between calls),
`active` (they spin), `threads15` / `threads8` (the kernel's thread count).

`python -m benchmarks.policies.bench_neo_layer --out ...` (on a CUDA device; without one it
runs on the CPU, a check of the code, not a measurement)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.common import time_once, write_result  # noqa: E402
from kvtier.bench.environment import cpu_name  # noqa: E402
from kvtier.kernels.cpu_attention import cpu_decode_attention  # noqa: E402
from kvtier.kernels.cpu_attention_build import cpu_attention_extension  # noqa: E402
from kvtier.kernels.cpu_attention_layers import CpuLayerWorker  # noqa: E402
from kvtier.policies.host_resident.runner_side import HostRowsLayout  # noqa: E402
from kvtier.policies.neo.runner_side import CpuRows  # noqa: E402

HIDDEN, INTER, HQ, HKV, D, BS, F_LAYERS = 4096, 14336, 32, 8, 128, 16, 4  # Llama-3.1-8B
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the CPU: a smoke run of the code only
VARIANTS: dict[str, tuple[dict[str, str], list[str]]] = {
    "default": ({}, []),
    "passive": ({"OMP_WAIT_POLICY": "PASSIVE"}, []),
    "active": ({"OMP_WAIT_POLICY": "ACTIVE"}, []),
    "threads15": ({}, ["--threads", "15"]),
    "threads8": ({}, ["--threads", "8"]),
}


class StandIn:
    """The GPU side: one set of an 8B layer's linear weights (every layer reads them again:
    436 MB, past the L2), the step's activations."""

    def __init__(self, batch: int):
        g = torch.Generator(device=DEVICE).manual_seed(0)

        def w(i: int, o: int) -> torch.Tensor:
            return (torch.randn(i, o, device=DEVICE, generator=g) / i**0.5).to(torch.bfloat16)
        self.qkv, self.o = w(HIDDEN, (HQ + 2 * HKV) * D), w(HQ * D, HIDDEN)
        self.gate_up, self.down = w(HIDDEN, 2 * INTER), w(INTER, HIDDEN)
        self.x = torch.randn(batch, HIDDEN, device=DEVICE, generator=g).to(torch.bfloat16)

    def before(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        h = F.rms_norm(x, (HIDDEN,)) @ self.qkv
        q, k, v = h.split([HQ * D, HKV * D, HKV * D], dim=1)
        return q.view(-1, HQ, D), k.view(-1, HKV, D), v.view(-1, HKV, D)

    def after(self, x: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        x = x + attn.reshape(x.shape[0], -1) @ self.o
        gu = F.rms_norm(x, (HIDDEN,)) @ self.gate_up
        return x + (F.silu(gu[:, :INTER]) * gu[:, INTER:]) @ self.down

    def layer(self, x: torch.Tensor) -> torch.Tensor:
        q, _, _ = self.before(x)
        return self.after(x, q)  # the device rows' attention left out: q stands for it


def host_rows(args: argparse.Namespace, worker: CpuLayerWorker) -> CpuRows:
    """`--rows` rows of `--context` tokens (the new one added) on pinned host pages."""
    n, groups = args.rows, -(-args.layers // F_LAYERS)
    width = -(-(args.context + 1) // BS)
    pages = torch.empty(groups * n * width, F_LAYERS, 2, HKV, BS, D, dtype=torch.bfloat16,
                        pin_memory=DEVICE == "cuda")
    pages.view(torch.int16).random_(-8000, 8000)  # finite bf16 of moderate size
    ids = np.random.default_rng(0).permutation(pages.shape[0]).astype(np.int32)
    tables = ids.reshape(groups, n, width)
    pos = np.full(n, args.context, dtype=np.int64)
    slots = tables[:, :, args.context // BS].astype(np.int64) * BS + args.context % BS
    layout = HostRowsLayout(num_rows=n, tables=tables, slots=np.ascontiguousarray(slots),
                            context_lens=np.full(n, args.context + 1, dtype=np.int32),
                            positions=pos)
    return CpuRows(layout, pages, F_LAYERS, None, worker, args.threads, HQ, DEVICE == "cuda")


def sequential_step(s: StandIn, rows: CpuRows | None, layers: int) -> None:
    x = s.x
    for i in range(layers):
        q, k, v = s.before(x)
        out = torch.empty_like(q)
        if rows is not None:
            rows.forward(i, q, k, v, D**-0.5, out, None)
        x = s.after(x, out)


def pipelined_step(s: StandIn, rows: CpuRows, layers: int) -> None:
    n = rows.num_rows
    x1, x0 = s.x[:n], s.x[n:]
    for i in range(layers):
        q1, k1, v1 = s.before(x1)
        pending = rows.submit(i, q1, k1, v1, D**-0.5, None)
        x0 = s.layer(x0)
        out1, _ = pending.result()
        x1 = s.after(x1, out1.to(x1.device, x1.dtype))


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_ms(fn: Callable[[], object], reps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = [time_once(fn, DEVICE == "cuda") for _ in range(reps)]
    return round(statistics.median(times) * 1e3, 3)


def parts_alone(s: StandIn, rows: CpuRows, reps: int, threads: int | None) -> dict[str, float]:
    """Each part of one layer's host rows, the GPU idle, median µs."""
    n, calls = rows.num_rows, rows.calls
    q, k, v = (t[:n] for t in s.before(s.x))
    host = [t.cpu() for t in (q, k, v)]
    o, _ = calls.submit(0, 0, q, k, v, D**-0.5).result()
    pages = rows.pages[:, 0]
    kernel = (host[0], pages[:, 0], pages[:, 1], calls.tables[0], calls.lens, D**-0.5)
    dev_out = torch.empty(n, HQ, D, device=DEVICE, dtype=torch.bfloat16)

    def out_back() -> None:
        dev_out.copy_(o, non_blocking=True)
        sync()
    parts = {
        "layer_call_from_gpu": lambda: calls.submit(0, 0, q, k, v, D**-0.5).result(),
        "layer_call_from_host": lambda: calls.submit(0, 0, *host, D**-0.5).result(),
        "kernel_wrapper": lambda: cpu_decode_attention(*kernel, num_threads=threads),
        "out_to_device": out_back,
    }
    return {name: round(median_ms(fn, reps) * 1e3, 1) for name, fn in parts.items()}


def child(args: argparse.Namespace) -> dict[str, Any]:
    if cpu_attention_extension() is None:
        sys.exit("the C++ kernel could not be built; nothing to measure")
    worker = CpuLayerWorker()
    s, rows = StandIn(args.batch), host_rows(args, worker)
    gpu_only = median_ms(lambda: sequential_step(s, None, args.layers), args.steps)
    seq = median_ms(lambda: sequential_step(s, rows, args.layers), args.steps)
    pipe = median_ms(lambda: pipelined_step(s, rows, args.layers), args.steps)
    parts = parts_alone(s, rows, 50, args.threads)
    worker.close()
    kv_bytes = 2 * args.rows * (args.context + 1) * HKV * D * 2
    return {"gpu_only_ms": gpu_only, "sequential_ms": seq, "pipelined_ms": pipe,
            "sequential_extra_per_layer_us": round((seq - gpu_only) / args.layers * 1e3, 1),
            "pipelined_extra_per_layer_us": round((pipe - gpu_only) / args.layers * 1e3, 1),
            "parts_alone_us": parts, "kv_bytes_per_layer": kv_bytes,
            "torch_threads_main": torch.get_num_threads()}


def run_variant(name: str, args: argparse.Namespace, rows: int) -> dict[str, Any]:
    env_extra, extra = VARIANTS[name]
    cmd = [sys.executable, "-m", "benchmarks.policies.bench_neo_layer", "--child",
           "--rows", str(rows), "--context", str(args.context), "--batch", str(args.batch),
           "--layers", str(args.layers), "--steps", str(args.steps), *extra]
    done = subprocess.run(cmd, env={**os.environ, **env_extra}, capture_output=True, text=True,
                          timeout=args.child_timeout)
    if done.returncode != 0:
        return {"error": done.stderr[-2000:]}
    return {"env": env_extra, "args": extra, **json.loads(done.stdout.splitlines()[-1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rows", default="1,4", help="host rows a step (one list in the parent)")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=25, help="rows a step, host rows included")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="the kernel's (default: torch's)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--child-timeout", type=int, default=120)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        args.rows = int(args.rows)
        print(json.dumps(child(args)))
        return
    if not args.out:
        sys.exit("--out is required")
    runs = []
    for rows in (int(r) for r in args.rows.split(",")):
        for name in args.variants.split(","):
            runs.append({"variant": name, "rows": rows, **run_variant(name, args, rows)})
            print(json.dumps(runs[-1]))
    write_result(args.out, {"host": {"cpu_model": cpu_name(), "logical_cpus": os.cpu_count()},
                            "context": args.context, "batch": args.batch, "layers": args.layers,
                            "steps": args.steps, "runs": runs})


if __name__ == "__main__":
    main()
