"""A step's swap copies, overlapped with its forward pass layer group by layer group
(the layer-level overlap of offloaded prefixes, applied to preempt-swap).

Why: a block holds F consecutive layers (one layer group), so a request swapped back in
is G = L/F independent pieces of KV. Copied in one lump before the forward, the whole
transfer sits on the critical path (a request's whole KV crosses PCIe before its first layer);
but layer l's attention needs only group l // F. So the copies go on a dedicated copy
stream, group 0's first, with one event per group, and the compute stream waits on group
g's event just before the first attention of group g: layers of earlier groups compute
while later groups' KV is still crossing PCIe. What remains exposed (the bubble) is the
first group's copy plus whatever the copies outrun the compute by.

Hazards, and what orders them (everything that touches a pool is on one of the two streams;
nothing on the host reads either pool):
  * a swap-out reads a device block the previous forward wrote, and a swap-in writes one
    the previous forward may have read (freed at a finish): the copy stream first waits for
    everything already on the compute stream (`begin`);
  * a swap-out's source block is free from this step on: a swap-in of the same step may
    land in it (stream order: swap-outs go first on the copy stream), and this step's
    kv_write may write it. So every group's event comes after all swap-outs, and the
    compute stream waits on group 0's event (at least) before its first attention;
  * host blocks are written by swap-outs and read by swap-ins, both on the copy stream:
    stream order alone makes a reused host block safe;
  * a later step may reuse a device block this step copied (a step with copies but no
    forward waits on nothing): the next `issue` first makes the compute stream wait for
    the copy stream's earlier work, which costs nothing when the forward already waited.
Steps that replay a full-model CUDA graph cannot wait in the middle: the runner sends decode
steps carrying swap-ins through the piecewise graphs (eager attention between pieces, where
the waits go) or, without them, waits for everything before the replay (`wait_all`).

With overlap off (EngineConfig.overlap_swap, the ablation) and on the CPU, `InOrderStreams`
puts every copy on the current stream in plan order and every wait is a no-op: today's
behaviour. The ordering and event bookkeeping is the same code for all three, so a fake
stream object (tests/runner/test_swap_copies.py) checks it on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any, Protocol

import torch

from kvtier.core.plan import BlockCopy


class Streams(Protocol):
    """Where copies go and how the compute stream is made to wait for them."""

    overlaps: bool  # copies run beside the compute (False: in order on the current stream)

    def begin(self) -> None:
        """The copy stream waits for the compute stream's work so far."""

    def copying(self) -> AbstractContextManager[Any]:
        """Copies (tensor.copy_) issued inside go to the copy stream."""

    def record(self) -> Any:
        """An event recorded on the copy stream after the copies issued so far."""

    def wait(self, event: Any) -> None:
        """The compute stream waits for `event`."""

    def join(self) -> None:
        """The compute stream waits for everything issued on the copy stream so far."""


class TierCopies(Protocol):
    """A cache tier's copies of this step (the host tier's stores and loads, staged by its
    plan items' hook), issued by `SwapCopies.issue` in its stream order: stores after the
    swap-outs, each layer group's loads before that group's swap-ins."""

    def has_work(self) -> bool: ...

    def has_loads(self) -> bool: ...

    def issue_stores(self, gpu: torch.Tensor) -> bool:
        """Issue the step's stores on the current stream; whether there were any."""

    def issue_loads(self, gpu: torch.Tensor, group: int) -> bool:
        """Issue layer group `group`'s loads on the current stream; whether any."""

    def issue_background(self, gpu: torch.Tensor) -> None:
        """Issue the copies no layer of the step waits for (last: blocks the step's
        forward neither reads nor writes), on the current stream."""

    def wait(self, streams: Streams, event: Any) -> None:
        """`streams.wait(event)` for a step with its loads (the tier times the stall)."""


class InOrderStreams:
    """Everything on the current stream, in plan order (the CPU, and overlap off)."""

    overlaps = False

    def begin(self) -> None:
        pass

    def copying(self) -> AbstractContextManager[Any]:
        return nullcontext()

    def record(self) -> Any:
        return None

    def wait(self, event: Any) -> None:
        pass

    def join(self) -> None:
        pass


class CudaCopyStream:
    """A dedicated CUDA stream for the copies; events without timing (cheap to record)."""

    overlaps = True

    def __init__(self, device: torch.device):
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def _compute(self) -> torch.cuda.Stream:
        return torch.cuda.current_stream(self.device)

    def begin(self) -> None:
        self.stream.wait_stream(self._compute())

    def copying(self) -> AbstractContextManager[Any]:
        return torch.cuda.stream(self.stream)

    def record(self) -> Any:
        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        self._compute().wait_event(event)

    def join(self) -> None:
        self._compute().wait_stream(self.stream)


def make_streams(device: torch.device, overlap: bool) -> Streams:
    if overlap and device.type == "cuda":
        return CudaCopyStream(device)
    return InOrderStreams()


def copy_blocks(dst_pool: torch.Tensor, src_pool: torch.Tensor, dst: Sequence[int],
                src: Sequence[int]) -> None:
    """dst_pool[dst[i]] = src_pool[src[i]], non-blocking. A run of copies whose source and
    target blocks both advance by one goes as one slice copy: one cudaMemcpyAsync of k
    blocks instead of k calls, each with a host cost that dwarfs a block's bytes (a request's
    blocks are mostly allocated in runs; offloaded prefixes' copies issue thousands a step;
    shared/hw/h200_probe_2026-11-30.json)."""
    i, n = 0, len(dst)
    while i < n:
        d, s, k = dst[i], src[i], 1
        while i + k < n and dst[i + k] == d + k and src[i + k] == s + k:
            k += 1
        if k == 1:
            dst_pool[d].copy_(src_pool[s], non_blocking=True)
        else:
            dst_pool[d : d + k].copy_(src_pool[s : s + k], non_blocking=True)
        i += k


def _swap_in(gpu: torch.Tensor, host: torch.Tensor, copies: Sequence[BlockCopy]) -> None:
    copy_blocks(gpu, host, [c.dst for c in copies], [c.src for c in copies])


class SwapCopies:
    """Issues a step's swap copies and answers, per layer, what the forward must wait for."""

    def __init__(self, streams: Streams, num_groups: int, layers_per_block: int):
        self.streams = streams
        self.num_groups, self.layers_per_block = num_groups, layers_per_block
        self.events: list[Any] = []  # recorded this step, in copy-stream order
        # ready[g]: index into events that group g's attention waits for (-1: nothing)
        self.ready: list[int] = [-1] * num_groups
        self.waited = -1  # the latest event the compute stream already waits for
        self.unjoined = False  # copies issued that the compute stream may not wait for yet
        self.has_swap_in = False  # this step carries swap-ins
        # Copies held back until a layer group's attention is done (the offloaded prefixes' copy window: they
        # land in scratch that group still reads): {group: [(target group, copies)]}.
        self.deferred: dict[int, list[tuple[int, list[BlockCopy]]]] = {}
        self._pools: tuple[torch.Tensor, torch.Tensor] | None = None
        self.tier: TierCopies | None = None  # the host tier's copies, when it has one
        self._wait: Callable[[Any], None] = self.streams.wait  # the tier's, with its loads

    @property
    def pending(self) -> bool:
        """Some layer of this step's forward still has to wait for a copy (or issue one)."""
        return self.waited < len(self.events) - 1 or bool(self.deferred)

    def issue(self, gpu: torch.Tensor, host: torch.Tensor,
              swap_out: Sequence[BlockCopy], swap_in: Sequence[BlockCopy],
              deferred: dict[int, list[tuple[int, list[BlockCopy]]]] | None = None) -> None:
        """All swap-outs, then the swap-ins group by group, one event after each group
        that has any (and one after the swap-outs when there are no swap-ins in group 0).
        `deferred[g]`: swap-ins issued only once layer group g's attention has been issued
        (`after_layer`), each for its target group."""
        s = self.streams
        if self.unjoined:  # the previous step's copies, before anything reuses their blocks
            s.join()
            self.unjoined = False
        self.events, self.ready, self.waited = [], [-1] * self.num_groups, -1
        # The pools are kept only while deferred copies still need them (after_layer).
        self.deferred = dict(deferred or {})
        self._pools = (gpu, host) if self.deferred else None
        tier = self.tier if self.tier is not None and self.tier.has_work() else None
        loads = tier is not None and tier.has_loads()
        self.has_swap_in = bool(swap_in) or bool(self.deferred) or loads
        self._wait = self.streams.wait
        if loads and tier is not None:
            self._wait = partial(tier.wait, s)
        if not swap_out and not swap_in and tier is None:
            return
        s.begin()
        by_group: list[list[BlockCopy]] = [[] for _ in range(self.num_groups)]
        for c in swap_in:
            by_group[c.group].append(c)
        current = -1
        with s.copying():
            copy_blocks(host, gpu, [c.dst for c in swap_out], [c.src for c in swap_out])
            out = bool(swap_out)
            if tier is not None:  # reads device blocks a load or swap-in below may reuse
                out = tier.issue_stores(gpu) or out
            for g, copies in enumerate(by_group):
                loads = tier is not None and tier.issue_loads(gpu, g)
                if copies:
                    _swap_in(gpu, host, copies)
                if copies or loads or (out and current < 0):
                    self.events.append(s.record())
                    current = len(self.events) - 1
                self.ready[g] = current
            if tier is not None:  # the next issue's join orders them before any reuse
                tier.issue_background(gpu)
        self.unjoined = True

    def join_previous(self) -> None:
        """The compute stream waits for the previous step's copies (before work of its own
        touches the pools outside `issue`)."""
        if self.unjoined:
            self.streams.join()
            self.unjoined = False

    def after_layer(self, layer_idx: int) -> None:
        """After layer `layer_idx`'s attention has been issued: at the end of a layer group,
        the copies deferred behind it go out, behind everything the compute stream has so
        far (that group's reads of the scratch they overwrite)."""
        f = self.layers_per_block
        if (layer_idx + 1) % f and layer_idx + 1 != self.num_groups * f:
            return
        later = self.deferred.pop(layer_idx // f, None)
        if not later:
            return
        assert self._pools is not None
        gpu, host = self._pools
        if not self.deferred:
            self._pools = None
        s = self.streams
        s.begin()
        with s.copying():
            for target, copies in later:
                _swap_in(gpu, host, copies)
                self.events.append(s.record())
                self.ready[target] = len(self.events) - 1
        self.unjoined = True

    def wait_layer(self, layer_idx: int) -> None:
        """Before layer `layer_idx`'s attention (its kv_write and reads)."""
        i = self.ready[layer_idx // self.layers_per_block]
        if i > self.waited:
            self._wait(self.events[i])
            self.waited = i

    def wait_all(self) -> None:
        """Before a forward that cannot wait between layers (a full-model graph replay), or
        anything else that touches the KV pool outside the layers."""
        if self.pending:
            self.waited = len(self.events) - 1
            self._wait(self.events[-1])

    def close(self) -> None:
        """Let the copies in flight end, then drop what a step left (deferred copies of a
        forward that never ran, and the pools kept for them): the runner's close() frees
        its pools, and such a reference would keep both alive until the runner is collected."""
        self.streams.join()
        self.unjoined = False
        self.events, self.deferred, self._pools = [], {}, None
        self.tier = None  # the host tier's pinned pages go with the runner's pools
