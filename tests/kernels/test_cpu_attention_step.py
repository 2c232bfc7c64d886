"""A step's CPU attention as one job (kvtier/kernels/cpu_attention_step.py,
csrc/cpu_step_call.h), driven here by a Python thread in the GPU's place: each layer runs
only once its ready flag reaches the epoch, writes what a layer call writes (bit for bit,
both page dtypes), and raises its done flag; a failing layer marks every remaining one
failed and raises at the wait; a cancelled or starved job stops with a clear error and
leaves the worker usable."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from kvtier.kernels.cpu_attention_layers import reference_layer
from kvtier.kernels.cpu_attention_step import Handoff, StepJob, native_steps, submit_step
from tests.kernels.test_cpu_attention_layers import (
    F_LAYERS,
    GROUPS,
    HKV,
    HQ,
    LENS,
    D,
    host_rows,
    qkv,
    worker,  # noqa: F401 - the fixture
)

LAYERS = GROUPS * F_LAYERS
SCALE = 0.3


def start(worker, pages, tables, slots, lens, epoch=1, timeout_s=30.0):  # noqa: F811
    handoff = Handoff(LAYERS, len(LENS) + 2, HQ, HKV, D, pages.dtype, pinned=False)
    handoff.epoch = epoch - 1
    job = submit_step(worker, handoff, pages, F_LAYERS, tables, slots, lens, SCALE,
                      num_threads=2, epoch=handoff.next_epoch(), timeout_s=timeout_s)
    return handoff, job


def play_gpu(handoff: Handoff, dtype: torch.dtype, epoch: int, layers=range(LAYERS)):
    """What the graph's kernels do: each layer's rows out, its ready flag, then the wait for
    its done flag; returns each layer's output and the done flags it saw."""
    n = len(LENS)
    outs, seen = [], []
    for layer in layers:
        handoff.qkv[layer, :n] = torch.cat(qkv(dtype, seed=layer), dim=1)
        handoff.flags[0, layer] = epoch
        deadline = time.monotonic() + 30
        while int(handoff.flags[1, layer]) not in (epoch, -epoch):
            assert time.monotonic() < deadline, f"layer {layer} never came back"
            time.sleep(0)
        seen.append(int(handoff.flags[1, layer]))
        outs.append(handoff.out[layer, :n].clone())
    return outs, seen


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_a_step_job_runs_each_layer_when_its_rows_are_in(worker, dtype):  # noqa: F811
    assert native_steps(worker, D)
    pages, tables, slots, lens = host_rows(dtype)
    expected = pages.clone()
    handoff, job = start(worker, pages, tables, slots, lens, epoch=7)
    outs, seen = play_gpu(handoff, dtype, epoch=7)
    job.wait()
    assert seen == [7] * LAYERS
    for layer, out in enumerate(outs):
        group, slot = divmod(layer, F_LAYERS)
        q, k, v = qkv(dtype, seed=layer)
        ref, _ = reference_layer(expected, tables, slots, lens, group, slot, q, k, v, SCALE)
        assert torch.equal(out, ref.to(dtype)), f"layer {layer}"
    assert torch.equal(pages, expected)


def test_a_layer_waits_for_its_ready_flag(worker):  # noqa: F811
    pages, tables, slots, lens = host_rows(torch.float32)
    handoff, job = start(worker, pages, tables, slots, lens)
    time.sleep(0.05)
    assert int(handoff.flags[1, 0]) == 0, "layer 0 ran before its rows came"
    handoff.flags[0, 1] = 1  # a later layer's flag alone starts nothing out of order
    time.sleep(0.05)
    assert handoff.flags[1].tolist() == [0] * LAYERS
    _, seen = play_gpu(handoff, torch.float32, epoch=1)
    job.wait()
    assert seen == [1] * LAYERS


def test_a_failing_layer_fails_the_rest_and_raises(worker):  # noqa: F811
    pages, tables, slots, lens = host_rows(torch.float32)
    slots[1, 0] = pages.shape[0] * pages.shape[4]  # group 1's slot past the pages
    before = pages.clone()
    handoff, job = start(worker, pages, tables, slots, lens)
    _, seen = play_gpu(handoff, torch.float32, epoch=1)
    assert seen == [1] * F_LAYERS + [-1] * F_LAYERS  # group 0 ran; group 1's layers failed
    with pytest.raises(ValueError, match="outside"):
        job.wait()
    for layer in range(F_LAYERS):  # group 0's K/V landed, group 1's none
        reference_layer(before, tables, slots, lens, 0, layer, *qkv(torch.float32, layer), SCALE)
    assert torch.equal(pages, before)
    slots[1, 0] = -1  # the worker goes on: a good step after the bad one
    handoff2, job2 = start(worker, pages, tables, slots, lens, epoch=2)
    _, seen = play_gpu(handoff2, torch.float32, epoch=2)
    job2.wait()
    assert seen == [2] * LAYERS


@pytest.mark.parametrize("how", ["cancel", "timeout"])
def test_a_job_whose_layers_never_come_stops(worker, how):  # noqa: F811
    pages, tables, slots, lens = host_rows(torch.float32)
    handoff, job = start(worker, pages, tables, slots, lens, timeout_s=0.2)
    if how == "cancel":
        threading.Timer(0.02, handoff.cancel, args=(1,)).start()
    with pytest.raises(RuntimeError, match="cancelled" if how == "cancel" else "did not come"):
        job.wait()
    assert handoff.flags[1].tolist() == [-1] * LAYERS
    assert isinstance(job, StepJob)


def test_a_job_records_when_each_layer_came_and_went(worker):  # noqa: F811
    """The job's timestamps (Handoff.times, time.monotonic_ns()'s clock) for profiling: a
    layer is seen after it was handed over and done before the next is seen; the GPU's
    side here sleeps 20 ms before each layer, which the waits between show."""
    pages, tables, slots, lens = host_rows(torch.float32)
    start_ns = time.monotonic_ns()
    handoff, job = start(worker, pages, tables, slots, lens, epoch=3)
    n, marks = len(LENS), []
    for layer in range(LAYERS):
        time.sleep(0.02)
        handoff.qkv[layer, :n] = torch.cat(qkv(torch.float32, seed=layer), dim=1)
        marks.append(time.monotonic_ns())
        handoff.flags[0, layer] = 3
        while int(handoff.flags[1, layer]) != 3:
            time.sleep(0)
    job.wait()
    seen, done = handoff.times[:, 0].tolist(), handoff.times[:, 1].tolist()
    assert all(m <= s <= d for m, s, d in zip(marks, seen, done))
    assert all(d <= s for d, s in zip(done, seen[1:]))
    parts = handoff.layer_times(start_ns)
    assert parts["between"] >= 0.02 * (LAYERS - 1) and parts["first"] >= 0.02
    assert 0 < parts["cpu"] < parts["between"]
