"""Admission past the device pool (NEO's "prefills go to the GPU if they fit, else to the
CPU"): the waiting prompts the scheduler would admit this step, and the device blocks they
need beyond the free ones, which the placement makes room for by moving running decodes to
the host pool.

NEO writes such a prompt's KV to the host pool itself, through one layer of device staging.
Here the prompt is prefilled on the device as every prompt is, and the room is made by
moving the newest device decodes out (LIFO): the step's batch is the one NEO's rule makes
(one more host row for each prompt that did not fit), and what crosses PCIe is a running
request's KV of about the prompt's size, with no staging area kept aside on the device.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtier.core.request import Request
from kvtier.kv.manager import KVCacheManager, cdiv


def admitted_prompt_blocks(running: Sequence[Request], waiting: Iterable[Request],
                           kv: KVCacheManager, budget: int, seats: int) -> int:
    """Device blocks of every layer group the waiting prompts need that the scheduler would
    admit this step (FCFS, each first chunk within the token budget the running requests
    leave, within the seats), each counted whole (its later chunks need them too), less its
    leading blocks the prefix cache holds on the device."""
    for req in running:
        budget -= min(req.num_tokens + req.num_pending_tokens - req.num_computed_tokens,
                      max(budget, 0))
    seats -= len(running)
    cache, need = kv.prefix_cache, 0
    for req in waiting:
        if budget <= 0 or seats <= 0:
            break
        cached = cache.admission_hashes(req)[1] if cache is not None else 0
        first = min(req.num_tokens - cached * kv.block_size, budget)
        need += kv.num_groups * (cdiv(req.num_tokens, kv.block_size) - cached)
        budget, seats = budget - first, seats - 1
    return need
