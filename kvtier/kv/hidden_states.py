"""What the KV manager needs of a memory system's hidden-state store (Placement.HIDDEN: hidden
states kept instead of KV, the KV re-projected from them; a memory system's
store implements it). Pure Python, like the manager."""

from __future__ import annotations

from typing import Protocol

from kvtier.kv.block_pool import BlockPool


class HiddenStates(Protocol):
    """Per-request blocks of hidden states standing in for KV (Placement.HIDDEN): each
    request's tokens from `first_token(request_id)` on are covered, extended as tokens are
    computed (the tokens before it came from a prefix cache: `unhide` takes them back from
    it, or the request recomputes)."""

    ids: dict[str, list[int]]
    pool: BlockPool
    # Whether its coverage may start after a prefix cache hit (see above); the manager
    # refuses a prefix cache beside a store that cannot.
    shares_blocks: bool

    def extend(self, request_id: str, num_tokens: int, first_token: int = 0
               ) -> tuple[int, ...]: ...

    def first_token(self, request_id: str) -> int: ...

    def covers(self, request_id: str, num_tokens: int) -> bool: ...

    def free(self, request_id: str) -> None: ...

    def check_integrity(self) -> None: ...
