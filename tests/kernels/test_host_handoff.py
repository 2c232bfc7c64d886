"""The GPU's half of the CPU hand-over (kvtier/kernels/host_handoff.py): rows out to pinned
memory and the ready flag raised after them; the output read back only once the done flag
reaches the epoch (a failed or silent host sets the error word instead of hanging); and the
two inside one captured CUDA graph, replayed for several epochs against a host thread that
answers each layer, equal to the references. On CPU: the kernels compile for sm_90 with
acquire/release at system scope (they have no interpreter path)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

N, HQ, HKV, D, LAYERS = 3, 8, 2, 64, 4


def rows(seed: int, device: str = "cuda"):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(N + 2, HQ, D, generator=gen)[:N]  # rows of a larger batch
    k = torch.randn(N, HKV, 2 * D, generator=gen)[:, :, :D]  # strided heads
    v = torch.randn(N, HKV, D, generator=gen)
    return tuple(x.to(device) for x in (q, k, v))


def pinned(*shape, dtype=torch.float32):
    return torch.zeros(*shape, dtype=dtype, pin_memory=True)


@pytest.mark.gpu
def test_rows_go_out_before_the_ready_flag():
    from kvtier.kernels.host_handoff import rows_to_host, rows_to_host_ref

    q, k, v = rows(0)
    dst, ready = pinned(N, HQ + 2 * HKV, D), pinned(1, dtype=torch.int32)
    counter = torch.zeros(1, dtype=torch.int32, device="cuda")
    epoch = torch.tensor([5], dtype=torch.int32, device="cuda")
    rows_to_host(q, k, v, dst, ready, counter, epoch)
    torch.cuda.synchronize()
    want, want_ready = torch.zeros_like(dst), torch.zeros_like(ready)
    rows_to_host_ref(q.cpu(), k.cpu(), v.cpu(), want, want_ready, 5)
    assert torch.equal(dst, want) and int(ready) == 5 and int(counter) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("done_value,error", [(5, 0), (-5, 1), (4, 1)])
def test_the_output_comes_back_once_done(done_value, error):
    """done == epoch: the rows; -epoch (the host failed) or never (a stale epoch, past the
    timeout): the error word, and the kernel returns."""
    from kvtier.kernels.host_handoff import rows_from_host

    src = torch.randn(N, HQ, D).pin_memory()
    out = torch.zeros(N + 1, HQ, D, device="cuda")
    done, err = pinned(1, dtype=torch.int32), pinned(1, dtype=torch.int32)
    done.fill_(done_value)
    epoch = torch.tensor([5], dtype=torch.int32, device="cuda")
    rows_from_host(src, out[:N], done, epoch, err, timeout_s=0.05)
    torch.cuda.synchronize()
    assert int(err) == error
    if not error:
        assert torch.equal(out[:N].cpu(), src) and not out[N].any()


def serve(ready: torch.Tensor, done: torch.Tensor, qkv: torch.Tensor, out: torch.Tensor,
          epochs: list[int], stop: threading.Event) -> None:
    """The host's side: per epoch and layer, wait for the rows, answer with a function of
    them (q's heads times the layer + 1), raise done."""
    for e in epochs:
        for layer in range(LAYERS):
            while int(ready[layer]) != e:
                if stop.is_set():
                    return
                time.sleep(0)
            out[layer] = qkv[layer, :, :HQ] * (layer + 1)
            done[layer] = e


@pytest.mark.gpu
def test_a_captured_graph_hands_every_layer_over_for_each_epoch():
    from kvtier.kernels.host_handoff import rows_from_host, rows_to_host

    qkv, out = pinned(LAYERS, N, HQ + 2 * HKV, D), pinned(LAYERS, N, HQ, D)
    flags, err = pinned(2, LAYERS, dtype=torch.int32), pinned(1, dtype=torch.int32)
    counters = torch.zeros(LAYERS, dtype=torch.int32, device="cuda")
    epoch = torch.zeros(1, dtype=torch.int32, device="cuda")
    q, k, v = rows(1)
    result = torch.zeros(LAYERS, N, HQ, D, device="cuda")

    def step():
        x = q
        for layer in range(LAYERS):
            rows_to_host(x, k, v, qkv[layer], flags[0, layer:layer + 1],
                         counters[layer:layer + 1], epoch)
            rows_from_host(out[layer], result[layer], flags[1, layer:layer + 1], epoch, err, 10.0)
            x = result[layer] + 1  # the next layer's rows depend on this one's output

    stop = threading.Event()
    host = threading.Thread(target=serve, args=(flags[0], flags[1], qkv, out, [1, 2, 3], stop))
    host.start()
    try:
        epoch.fill_(1)
        step()  # warm-up (compiles), epoch 1
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
        for e in (2, 3):
            epoch.fill_(e)
            result.zero_()
            graph.replay()
            torch.cuda.synchronize()
            x = q
            for layer in range(LAYERS):
                assert torch.equal(result[layer], x * (layer + 1)), (e, layer)
                x = result[layer] + 1
    finally:
        stop.set()
        host.join(timeout=30)
    assert int(err) == 0 and flags[1].tolist() == [3] * LAYERS


def test_the_kernels_compile_for_sm90_with_system_scope_ordering():
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.sm90_compile", "handoff"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    ptx = proc.stdout
    for instruction in ("fence.sc.sys", "atom.global.sys.acq_rel.add", "st.release.sys.global",
                        "ld.acquire.sys.global", "%globaltimer"):
        assert instruction in ptx, instruction
