"""A pool of physical KV blocks: allocate, free, count. It knows nothing of requests."""

from __future__ import annotations


class OutOfBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, name: str):
        self.num_blocks, self.name = num_blocks, name
        # A stack: the most recently freed block is reused first (warm in cache/TLB).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise OutOfBlocksError(f"{self.name}: want {n} blocks, {len(self._free)} free")
        ids = self._free[len(self._free) - n :][::-1]  # ascending on a fresh pool
        del self._free[len(self._free) - n :]
        for i in ids:
            self._is_free[i] = 0
        return ids

    def free(self, ids: list[int]) -> None:
        for i in ids:
            if self._is_free[i]:
                raise AssertionError(f"{self.name}: block {i} freed twice")
            self._is_free[i] = 1
        self._free.extend(reversed(ids))

    def check_integrity(self, owned: list[int]) -> None:
        """Every block is either free (once) or owned (once), never both, never neither."""
        assert len(set(self._free)) == len(self._free), f"{self.name}: duplicate in free list"
        assert all(self._is_free[i] for i in self._free), f"{self.name}: free flags out of sync"
        owned_set = set(owned)
        assert len(owned_set) == len(owned), f"{self.name}: a block is owned twice"
        assert not owned_set & set(self._free), f"{self.name}: an owned block is also free"
        assert len(owned) + len(self._free) == self.num_blocks, (
            f"{self.name}: {self.num_blocks - len(owned) - len(self._free)} blocks leaked"
        )
