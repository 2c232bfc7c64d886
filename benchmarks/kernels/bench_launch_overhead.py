"""Host cost of one launch of each kernel wrapper (Triton + our checks) vs a torch op, at a
small shape where the GPU finishes long before the host issues the next launch.

  python -m benchmarks.kernels.bench_launch_overhead --out launch_overhead_h200.json
"""

from __future__ import annotations

import argparse
import time

import torch

from benchmarks.common import write_result


def host_us(fn, n: int = 2000) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    t = time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * t / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from kvtier.kernels.kv_write import kv_write
    from kvtier.kernels.paged_decode_attention import paged_decode_attention
    from kvtier.kernels.paged_prefill_attention import paged_prefill_attention
    from kvtier.kernels.rms_norm import fused_add_rms_norm, rms_norm
    from kvtier.kernels.rotary import rotary

    dev, dt = torch.device("cuda"), torch.bfloat16
    T, H, Hkv, D, BS, NB = 64, 32, 8, 128, 16, 256
    x = torch.randn(T, 4096, device=dev, dtype=dt)
    w = torch.ones(4096, device=dev, dtype=dt)
    res = torch.randn_like(x)
    q = torch.randn(T, H, D, device=dev, dtype=dt)
    k = torch.randn(T, Hkv, D, device=dev, dtype=dt)
    v = torch.randn_like(k)
    cache = torch.zeros(NB, 4, 2, BS, Hkv, D, device=dev, dtype=dt)[:, 0]
    slots = torch.arange(T, device=dev)
    nreq = 8
    tables = torch.arange(nreq * 8, device=dev, dtype=torch.int32).view(nreq, 8)
    seq = torch.full((nreq,), 100, device=dev, dtype=torch.int32)
    qsl = torch.arange(0, T + 1, T // nreq, device=dev, dtype=torch.int32)
    pos = torch.arange(T, device=dev)
    cos_sin = torch.randn(4096, D, device=dev, dtype=torch.float32)
    wmat = torch.randn(4096, 4096, device=dev, dtype=dt)
    cases = {
        "torch_matmul_64x4096x4096": lambda: x @ wmat,
        "torch_add": lambda: x + res,
        "rms_norm": lambda: rms_norm(x, w, 1e-5),
        "fused_add_rms_norm": lambda: fused_add_rms_norm(x, res, w, 1e-5),
        "kv_write": lambda: kv_write(cache, k, v, slots),
        "paged_decode_attention": lambda: paged_decode_attention(
            q[:nreq], cache, tables, seq, 0.1, max_seq_len=100),
        "paged_prefill_attention": lambda: paged_prefill_attention(
            q, cache, tables, seq, qsl, 0.1),
    }
    cases["rotary"] = lambda: rotary(q, k, pos, cos_sin, inplace=True)
    result = {}
    for name, fn in cases.items():
        try:
            result[name] = host_us(fn)
        except Exception as e:
            result[name] = f"error: {e!r}"[:300]
        print(f"{name:32s} {result[name]}")
    write_result(args.out, {"host_us_per_launch": result})


if __name__ == "__main__":
    main()
