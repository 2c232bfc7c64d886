"""Rows handed to a host thread and back inside a CUDA graph: the GPU's half of a step whose
host rows attend on the CPU while the graph replays (csrc/cpu_step_call.h is the CPU's).

Per layer, `rows_to_host` writes the rows' q, k and v into pinned memory through its UVA
address and then raises the layer's ready flag to the step's epoch; `rows_from_host` waits
for the layer's done flag to reach the epoch and copies the rows' output back. The epoch is
a device scalar, refilled before each replay, so a graph captured once serves every step.

Ordering, in the PTX memory model: every program of `rows_to_host` fences at system scope
after its stores and counts itself on a device counter (release, system scope); the last
to count resets the counter and stores the flag with release semantics, so the host sees
the flag only after every program's rows. `rows_from_host` reads the flag with acquire
semantics (and the rows volatile: nothing cached of an earlier step). A wait past
`timeout_ns`, or a done flag of -epoch (the host job failed), sets the error word and goes
on: the step's output is garbage then, and the host raises from the job's error.

Pure PTX (acquire/release at system scope), so no interpreter path: the references below
are the CPU path of the same hand-over and the tests' oracle.

    dst/src[n, W, D] (W = Hq + 2 Hkv for q/k/v rows, Hq for the output), pinned
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kvtier.kernels.launch import check
from kvtier.kernels.ptx import fence_sys, global_ns, ld_acquire_sys, st_release_sys


@triton.jit
def _store_heads(src, s_head, dst, first, H: tl.constexpr, D: tl.constexpr,
                 BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """Heads [0, H) of one row of src into heads [first, first + H) of one dst row."""
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < H) & (d < D)
    x = tl.load(src + h * s_head + d, mask=mask)
    tl.store(dst + (first + h) * D + d, x, mask=mask)


@triton.jit
def _rows_to_host_kernel(q, k, v, dst, ready, counter, epoch, num_rows,
                         q_row, q_head, k_row, k_head, v_row, v_head,
                         HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr, BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    W: tl.constexpr = HQ + 2 * HKV
    out = dst + row * W * D
    _store_heads(q + row * q_row, q_head, out, 0, HQ, D, BLOCK_HQ, BLOCK_D)
    _store_heads(k + row * k_row, k_head, out, HQ, HKV, D, BLOCK_HKV, BLOCK_D)
    _store_heads(v + row * v_row, v_head, out, HQ + HKV, HKV, D, BLOCK_HKV, BLOCK_D)
    fence_sys()
    tl.debug_barrier()  # every thread's stores fenced before the program counts itself
    before = tl.atomic_add(counter, 1, sem="acq_rel", scope="sys")
    if before == num_rows - 1:  # the last program: every row is out
        tl.store(counter, 0)  # for the next replay (stream order keeps it from this one)
        st_release_sys(ready, tl.load(epoch))


@triton.jit
def _rows_from_host_kernel(src, out, done, epoch, error, timeout_ns, o_row, o_head,
                           HQ: tl.constexpr, D: tl.constexpr, BLOCK_HQ: tl.constexpr,
                           BLOCK_D: tl.constexpr):
    row = tl.program_id(0)
    e = tl.load(epoch)
    start = global_ns()
    seen = ld_acquire_sys(done)
    while (seen != e) & (seen != -e) & (global_ns() - start < timeout_ns):
        seen = ld_acquire_sys(done)
    if seen != e:
        tl.store(error, 1)
    h = tl.arange(0, BLOCK_HQ)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < HQ) & (d < D)
    x = tl.load(src + row * HQ * D + h * D + d, mask=mask, cache_modifier=".cv")
    tl.store(out + row * o_row + h * o_head + d, x, mask=mask)


def _check_rows(x: torch.Tensor, name: str) -> None:
    check(x.dim() == 3 and x.stride(2) == 1, lambda: f"{name}: [n, H, D], D contiguous")


def rows_to_host(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dst: torch.Tensor,
                 ready: torch.Tensor, counter: torch.Tensor, epoch: torch.Tensor) -> None:
    """dst[:n] = [q | k | v] by heads (pinned, contiguous [n, Hq + 2 Hkv, D]), then
    ready[0] = epoch[0] once all of it is in host memory. counter: a device int32 scalar
    at 0, this call's alone."""
    n, hq, d = q.shape
    hkv = k.shape[1]
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_rows(x, name)
    check(dst.is_contiguous() and tuple(dst.shape) == (n, hq + 2 * hkv, d),
          lambda: f"rows_to_host: dst {tuple(dst.shape)} for {n} rows of {hq}+2x{hkv} heads")
    if n == 0:
        return
    _rows_to_host_kernel[(n,)](
        q, k, v, dst, ready, counter, epoch, n, q.stride(0), q.stride(1), k.stride(0),
        k.stride(1), v.stride(0), v.stride(1), HQ=hq, HKV=hkv, D=d,
        BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_HKV=triton.next_power_of_2(hkv),
        BLOCK_D=triton.next_power_of_2(d))


def rows_from_host(src: torch.Tensor, out: torch.Tensor, done: torch.Tensor,
                   epoch: torch.Tensor, error: torch.Tensor, timeout_s: float) -> None:
    """Once done[0] == epoch[0]: out[:n] = src[:n] (pinned, contiguous [n, Hq, D])."""
    n, hq, d = out.shape
    _check_rows(out, "out")
    check(src.is_contiguous() and tuple(src.shape) == (n, hq, d),
          lambda: f"rows_from_host: src {tuple(src.shape)} for out {tuple(out.shape)}")
    if n == 0:
        return
    _rows_from_host_kernel[(n,)](
        src, out, done, epoch, error, int(timeout_s * 1e9), out.stride(0), out.stride(1),
        HQ=hq, D=d, BLOCK_HQ=triton.next_power_of_2(hq), BLOCK_D=triton.next_power_of_2(d))


def rows_to_host_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dst: torch.Tensor,
                     ready: torch.Tensor, epoch: int) -> None:
    torch.cat([q, k, v], dim=1, out=dst)
    ready.fill_(epoch)


def rows_from_host_ref(src: torch.Tensor, out: torch.Tensor, done: torch.Tensor,
                       epoch: int) -> None:
    if int(done.item()) != epoch:
        raise RuntimeError(f"the host's output is not ready (done {int(done.item())}, "
                           f"epoch {epoch})")
    out.copy_(src)
