"""Programmatic dependent launch (PDL, Hopper and later) for the decode step's small kernels.

A decode step is ~450 launches, most of them short: at the tail of a batch (a few requests) a
layer's RMSNorm, rotary + KV write, attention and SiLU*mul are each a few microseconds long, and
the gap between the end of one kernel and the first loads of the next is a visible share of
that. A kernel launched with PDL may be scheduled while the kernel before it in the stream is
still draining; its programs then wait (`griddepcontrol.wait`) until that kernel has finished
and its writes are visible, and only then read anything. So the launch and the programs' set-up
overlap the previous kernel's last wave, and nothing is read early. Each kernel here also
signals at once that its own successor may be scheduled (`griddepcontrol.launch_dependents`: it
takes effect when every program of the kernel has issued it), which matters only to a
successor launched with PDL, which waits all the same.

CUDA graphs keep the launch attribute as a programmatic edge, so the captured decode steps
get the overlap too. Off under the CPU interpreter, before Hopper, and with KVTIER_PDL=0
(to measure what it is worth).
"""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kvtier.kernels.launch import interpreting


def pdl_launch(device: torch.device) -> dict[str, bool]:
    """Launch options of a kernel taking `USE_PDL`: its constexpr, plus `launch_pdl` where
    the device can."""
    if device.type != "cuda" or interpreting() or os.environ.get("KVTIER_PDL", "1") == "0":
        return {"USE_PDL": False}
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not _has_pdl(index):
        return {"USE_PDL": False}
    return {"USE_PDL": True, "launch_pdl": True}


@functools.cache
def _has_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


@triton.jit
def wait_for_previous_kernel(USE_PDL: tl.constexpr):
    """First thing a PDL kernel does: wait for the kernel before it (a no-op without PDL),
    then let the next one be scheduled."""
    if USE_PDL:
        gdc_wait()
        gdc_launch_dependents()
