"""Layer-wise loading of host-tier hits (kvtier/offload/transfers.py through
SwapCopies): the order the tier's copies and events are issued in against the swap copies,
and which event each layer waits for, with the fake streams of tests/runner."""

from __future__ import annotations

import torch

from kvtier.core.plan import BlockCopy
from kvtier.kernels.host_page_backends import PageIOConfig
from kvtier.kv.host_tier_items import HostBackup, HostLoad, HostPrefetch, HostStore
from kvtier.offload.transfers import HostTierCopies
from tests.runner.test_swap_copies import F, G, make


class LoggingTier:
    """The TierCopies protocol with HostTierCopies' staging, logging what it issues."""

    def __init__(self, streams):
        self.streams = streams
        self.copies = HostTierCopies(torch.empty(0), PageIOConfig(), G, torch.device("cpu"))
        self.copies.io = self  # log instead of moving bytes

    def store(self, gpu, pages, blocks, host_pages):
        assert self.streams.on_copy
        self.streams.log.append(("store", tuple(blocks), tuple(host_pages)))

    def load(self, pages, gpu, host_pages, blocks, awaited=False):
        assert self.streams.on_copy
        self.streams.log.append(("load" if awaited else "prefetch", tuple(host_pages),
                                 tuple(blocks)))


def test_stores_then_per_group_loads_with_an_event_each_then_backups():
    s, sc, gpu, host = make()
    tier = LoggingTier(s)
    sc.tier = tier.copies
    tier.copies.stage([HostStore((7,), (70,)), HostBackup((8,), (80,))],
                      [HostLoad("r", (1, 2, 3), (11, 12, 13), (0, 1, 2))])
    sc.issue(gpu, host, [BlockCopy(5, 50, 1)], [BlockCopy(60, 6, 1)])
    assert s.log == [
        ("begin",),
        ("copy", "gpu5->host50"),  # swap-outs first: a load may land in a freed block
        ("store", (7,), (70,)),  # urgent stores before any load: their blocks are reused
        ("load", (1,), (11,)), ("record", 1),
        ("load", (2,), (12,)), ("copy", "host60->gpu6"), ("record", 2),
        ("load", (3,), (13,)), ("record", 3),
        ("store", (8,), (80,)),  # the backup: after every event, waited for by no layer
    ]
    assert sc.has_swap_in and sc.ready == [0, 1, 2]
    s.log.clear()
    for layer in range(G * F):
        sc.wait_layer(layer)
    assert s.log == [("wait", 1), ("wait", 2), ("wait", 3)]  # layer group by group
    assert not tier.copies.has_work()


def test_a_step_with_backups_only_lets_every_layer_run_at_once():
    s, sc, gpu, host = make()
    tier = LoggingTier(s)
    sc.tier = tier.copies
    tier.copies.stage([HostBackup((8, 9), (80, 81))], [])
    sc.issue(gpu, host, [], [])
    assert s.log == [("begin",), ("store", (8, 9), (80, 81))]
    assert not sc.pending and not sc.has_swap_in
    sc.issue(gpu, host, [], [])  # the next step joins them before anything reuses a block
    assert s.log[-1] == ("join",)


def test_a_prefetch_is_not_awaited_and_loads_are():
    """Only the loads a layer waits for are issued as awaited (the kernel gives them more
    programs); a prefetch runs in the background like a backup."""
    s, sc, gpu, host = make()
    tier = LoggingTier(s)
    sc.tier = tier.copies
    tier.copies.stage([], [HostPrefetch((14,), (4,)), HostLoad("r", (1,), (11,), (0,))])
    sc.issue(gpu, host, [], [])
    assert [e for e in s.log if e[0] in ("load", "prefetch")] == [
        ("load", (1,), (11,)), ("prefetch", (4,), (14,))]
