"""HCache's hidden-state store: per request, host blocks of per-layer hidden states.

A hidden block holds `block_size` tokens x every layer x hidden_size values: the input of
each layer's attention (after its RMSNorm). From it the K/V projection alone restores a
layer's KV, with no attention and no MLP, so a preempted request can come back at a
fraction of recompute's FLOPs, and from fewer bytes than its KV for MHA models (h values per
layer instead of 2 x kv_heads x head_dim). Coverage is a prefix of the request's token
blocks, extended as tokens are computed; when the pool runs out the request loses its
coverage (it will be recomputed instead if preempted).
"""

from __future__ import annotations

from kvtier.kv.block_pool import BlockPool


class HiddenStore:
    # Hidden states are captured while a request computes its tokens: the tokens of a prefix
    # cache hit were computed by another request, so none are kept to restore their KV from.
    shares_blocks = False

    def __init__(self, num_blocks: int, block_size: int):
        self.pool = BlockPool(num_blocks, "hidden")
        self.block_size = block_size
        self.ids: dict[str, list[int]] = {}
        self._lost: set[str] = set()  # requests whose coverage ran out of blocks

    def extend(self, request_id: str, num_tokens: int) -> tuple[int, ...]:
        """Cover tokens [0, num_tokens); returns the newly added block ids."""
        if request_id in self._lost:
            return ()
        ids = self.ids.setdefault(request_id, [])
        want = -(-num_tokens // self.block_size) - len(ids)
        if want <= 0:
            return ()
        if not self.pool.can_allocate(want):
            self._lost.add(request_id)
            self.pool.free(self.ids.pop(request_id))
            return ()
        new = self.pool.allocate(want)
        ids.extend(new)
        return tuple(new)

    def covers(self, request_id: str, num_tokens: int) -> bool:
        have = len(self.ids.get(request_id, ())) * self.block_size
        return request_id not in self._lost and have >= num_tokens

    def free(self, request_id: str) -> None:
        self._lost.discard(request_id)
        ids = self.ids.pop(request_id, None)
        if ids:
            self.pool.free(ids)

    def check_integrity(self) -> None:
        self.pool.check_integrity([b for ids in self.ids.values() for b in ids])
