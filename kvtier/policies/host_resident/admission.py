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
from kvtier.policies.host_resident.step_tokens import StepTokens


def admitted_prompt_blocks(running: Sequence[Request], waiting: Iterable[Request],
                           kv: KVCacheManager, step: StepTokens, seats: int) -> tuple[int, int]:
    """Device blocks of every layer group the prompts need beyond what their tables hold:
    (the running ones' to their last tokens, so a chunked prompt's later chunks keep the
    room made for it; the waiting ones the scheduler would admit this step: FCFS, each with
    its first chunk within `step`'s budget and prefill chunks (the whole prompt without
    chunked prefill), within the seats, each counted whole). A prefix-cache hit is not taken
    off: the blocks only the cache holds count as free already, and a hit that running
    requests share is the one case this overcounts."""
    held = 0
    for req in running:
        remaining = req.num_tokens + req.num_pending_tokens - req.num_computed_tokens
        table = kv.tables.get(req.request_id)
        if remaining > 1 and table is not None:  # a prompt part-way
            held += kv.num_groups * max(0, cdiv(req.num_tokens, kv.block_size)
                                        - table.num_token_blocks)
    step.take_running(running)  # they come first out of the budget and partial places
    seats -= len(running)
    new = 0
    for req in waiting:
        if seats <= 0 or not step.admit(req):
            break
        new += kv.num_groups * cdiv(req.num_tokens, kv.block_size)
        seats -= 1
    return held, new
