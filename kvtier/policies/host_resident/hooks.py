"""The runner hooks of the host-resident items (kvtier/core/items.py's contract). The tensors
are the source the system attached to the runner; runner_side.py (torch) is imported only
when a real engine runs a hook, so this module stays torch-free for the simulator."""

from __future__ import annotations

from kvtier.policies.host_resident.items import HostRows, MoveToDevice, MoveToHost


def run_store(runner, items: list[MoveToHost]) -> None:
    from kvtier.policies.host_resident.runner_side import source_of

    source_of(runner).store(items)


def run_load(runner, items: list[MoveToDevice]) -> None:
    from kvtier.policies.host_resident.runner_side import source_of

    source_of(runner).load(items)


def run_rows(runner, items: list[HostRows]) -> None:
    """Nothing before the forward: the source reads the rows in `for_step`."""
    return None
