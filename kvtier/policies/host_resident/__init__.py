"""The shared placement "running, KV in host memory": a running request's KV (every layer
group, every token block) lives in the host pool, its new tokens' K/V are appended there
each step, and its decode attention is computed by the system over the host pages, not by
the device pool's kernels. NEO (kvtier/policies/neo/, attention on the CPU) and DirectKV
(kvtier/policies/directkv/, the GPU reading host memory in place) build on it.

  placement.py    which requests run from the host, and when they come back (NEO's rule)
  items.py        the plan items: moves (MoveToHost, MoveToDevice), the step's host rows
                  and how many of them keep a device suffix (SplitRows)
  hooks.py        their runner hooks
  runner_side.py  host pages, the moves' copies, the rows handed to attention (torch)
  system.py       flags, options and assembly shared by the systems

Everything but runner_side.py is torch-free (the simulator and the pricing import it).
"""

from kvtier.core.items import register_item
from kvtier.policies.host_resident.hooks import run_load, run_rows, run_store
from kvtier.policies.host_resident.items import (
    HostRows,
    MoveToDevice,
    MoveToHost,
    SplitRows,
    kv_bytes_per_token,
    price_load,
    price_store,
)
from kvtier.policies.host_resident.options import HostResidentOptions
from kvtier.policies.host_resident.placement import HostResidentPolicy
from kvtier.policies.host_resident.system import HostResidentArgs, HostResidentSystem

register_item(MoveToHost, run=run_store, price=price_store)
register_item(MoveToDevice, run=run_load, price=price_load)

__all__ = ["MoveToDevice", "HostResidentArgs", "HostResidentOptions", "HostResidentPolicy",
           "HostResidentSystem", "HostRows", "MoveToHost", "SplitRows", "kv_bytes_per_token",
           "run_rows"]
