"""HCache's hidden-state store: per request, host blocks of per-layer hidden states.

A hidden block holds `block_size` tokens x every layer x hidden_size values: the input of
each layer's attention (after its RMSNorm). From it the K/V projection alone restores a
layer's KV, with no attention and no MLP, so a preempted request can come back at a
fraction of recompute's FLOPs, and from fewer bytes than its KV for MHA models (h values per
layer instead of 2 x kv_heads x head_dim). Coverage is a run of the request's token
blocks, extended as tokens are computed; when the pool runs out the request loses its
coverage (it will be recomputed instead if preempted). The run starts at the first token the
request computed itself: the blocks of a prefix cache hit were computed by another request,
so they have no hidden states here (docs/PREFIX_CACHE.md: a hidden request takes them back
from the cache when it returns, or recomputes).
"""

from __future__ import annotations

from kvtier.kv.block_pool import BlockPool


class HiddenStore:
    # A request's coverage starts after its prefix cache hit (`first_token`): the KV manager
    # takes those blocks back from the cache instead of restoring them.
    shares_blocks = True

    def __init__(self, num_blocks: int, block_size: int):
        self.pool = BlockPool(num_blocks, "hidden")
        self.block_size = block_size
        self.ids: dict[str, list[int]] = {}
        self._first_block: dict[str, int] = {}  # token block of each request's ids[0]
        self._lost: set[str] = set()  # requests whose coverage ran out of blocks

    def extend(self, request_id: str, num_tokens: int, first_token: int = 0) -> tuple[int, ...]:
        """Cover tokens [first, num_tokens); returns the newly added block ids. `first_token`
        (block-aligned: where a prefix cache hit ends) is read only when the request has no
        coverage yet: the tokens before it are not this request's to keep."""
        if request_id in self._lost:
            return ()
        ids = self.ids.get(request_id)
        if ids is None:
            assert first_token % self.block_size == 0, "coverage starts at a block boundary"
            ids = self.ids[request_id] = []
            self._first_block[request_id] = first_token // self.block_size
        want = -(-num_tokens // self.block_size) - self._first_block[request_id] - len(ids)
        if want <= 0:
            return ()
        if not self.pool.can_allocate(want):
            self._lost.add(request_id)
            self.pool.free(self.ids.pop(request_id))
            del self._first_block[request_id]
            return ()
        new = self.pool.allocate(want)
        ids.extend(new)
        return tuple(new)

    def first_token(self, request_id: str) -> int:
        """The first token covered (0 for a request with no hit); tokens before it have no
        hidden states."""
        return self._first_block.get(request_id, 0) * self.block_size

    def covers(self, request_id: str, num_tokens: int) -> bool:
        """Tokens [first_token, num_tokens) have hidden states."""
        if request_id in self._lost:
            return False
        ids = self.ids.get(request_id)
        if ids is None:
            return num_tokens == 0
        return (self._first_block[request_id] + len(ids)) * self.block_size >= num_tokens

    def free(self, request_id: str) -> None:
        self._lost.discard(request_id)
        self._first_block.pop(request_id, None)
        ids = self.ids.pop(request_id, None)
        if ids:
            self.pool.free(ids)

    def check_integrity(self) -> None:
        self.pool.check_integrity([b for ids in self.ids.values() for b in ids])
        assert self._first_block.keys() == self.ids.keys(), "first blocks of unknown requests"
