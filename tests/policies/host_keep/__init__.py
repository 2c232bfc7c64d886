"""A memory system defined outside kvtier, to show that adding one takes its package and
its registrations only (tests/policies/test_host_keep.py)."""

from __future__ import annotations

from kvtier.config import EngineConfig
from kvtier.core.items import register_item
from kvtier.policies import register_system
from kvtier.policies.base import MemorySystem
from tests.policies.host_keep.items import (
    KeepIn,
    KeepOut,
    price_keep_in,
    price_keep_out,
    run_keep_in,
    run_keep_out,
)
from tests.policies.host_keep.policy import HostKeepArgs, HostKeepOptions, HostKeepPolicy


class HostKeepSystem(MemorySystem):
    name = "host_keep"
    policy = HostKeepPolicy
    args = HostKeepArgs

    def options(self, args: HostKeepArgs, config: EngineConfig) -> HostKeepOptions:
        return HostKeepOptions(max_kept=args.max_kept)


def register() -> None:
    """The registration lines (a package inside kvtier would run them on import)."""
    register_item(KeepOut, run=run_keep_out, price=price_keep_out)
    register_item(KeepIn, run=run_keep_in, price=price_keep_in)
    register_system(HostKeepSystem)
