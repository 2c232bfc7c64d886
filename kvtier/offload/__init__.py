"""KV offloading to host memory: the host tier of the prefix cache (kvtier/kv/host_tier.py is
its index), its flags (args.py), the runner's pinned pages and copies (transfers.py), its
plan items' hooks and prices (items.py), cache-aware admission (scheduling.py) and the
wiring onto an engine (install.py). Not a memory system: it works beside any of them.
docs/HOST_TIER.md."""

from functools import partial

from kvtier.core.items import register_item
from kvtier.kv.host_tier_items import (
    HostBackup,
    HostBackupDirect,
    HostLoad,
    HostLoadDirect,
    HostPrefetch,
    HostPrefetchDirect,
    HostStore,
    HostStoreDirect,
)
from kvtier.offload.items import (
    copy_seconds,
    price_backups,
    price_backups_direct,
    price_host_loads,
    price_host_loads_direct,
    price_host_stores,
    price_host_stores_direct,
    price_prefetches,
    price_prefetches_direct,
    run_host_loads,
    run_host_stores,
)

# Backups and prefetches run on the copy stream behind the step: their whole copy is their
# `background`, which the next step waits for where it outlasts this one.
register_item(HostStore, run=run_host_stores, price=price_host_stores)
register_item(HostBackup, run=run_host_stores, price=price_backups,
              background=partial(copy_seconds, to_device=False))
register_item(HostPrefetch, run=run_host_loads, price=price_prefetches,
              background=partial(copy_seconds, to_device=True))
register_item(HostLoad, run=run_host_loads, price=price_host_loads)
register_item(HostStoreDirect, run=run_host_stores, price=price_host_stores_direct)
register_item(HostLoadDirect, run=run_host_loads, price=price_host_loads_direct)
register_item(HostBackupDirect, run=run_host_stores, price=price_backups_direct,
              background=partial(copy_seconds, to_device=False, direct=True))
register_item(HostPrefetchDirect, run=run_host_loads, price=price_prefetches_direct,
              background=partial(copy_seconds, to_device=True, direct=True))
