"""A pool of physical KV blocks: allocate, reference, release, count. It knows nothing of
requests.

Each block has a reference count: `allocate` hands out blocks at 1, `incref` adds an owner
(a second request sharing a cached prefix block, a prefix cache keeping it), `decref` (alias
`free`) drops one; a block returns to the free stack when its count reaches 0.

        ref 0  --allocate-->  ref 1  --incref-->  ref 2 ...
          ^                     |                   |
          +------decref---------+ <----decref-------+
"""

from __future__ import annotations

from collections import Counter


class OutOfBlocksError(RuntimeError):
    pass


class BlockPool:
    def __init__(self, num_blocks: int, name: str):
        self.num_blocks, self.name = num_blocks, name
        # A stack: the most recently freed block is reused first (warm in cache/TLB).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._refs: list[int] = [0] * num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._refs[block_id]

    def allocate(self, n: int) -> list[int]:
        """`n` free blocks, each with one reference (the caller's)."""
        if n > len(self._free):
            raise OutOfBlocksError(f"{self.name}: want {n} blocks, {len(self._free)} free")
        ids = self._free[len(self._free) - n :][::-1]  # ascending on a fresh pool
        del self._free[len(self._free) - n :]
        refs = self._refs
        for i in ids:
            refs[i] = 1
        return ids

    def incref(self, ids: list[int]) -> None:
        """One more owner for each block (each must be in use)."""
        refs = self._refs
        for i in ids:
            if not refs[i]:
                raise AssertionError(f"{self.name}: block {i} is free, it cannot be shared")
            refs[i] += 1

    def decref(self, ids: list[int]) -> list[int]:
        """Drop one owner of each block; returns the blocks that became free (in `ids`
        order), which go back on the free stack."""
        refs = self._refs
        freed = []
        for i in ids:
            r = refs[i]
            if not r:
                raise AssertionError(f"{self.name}: block {i} freed twice")
            refs[i] = r - 1
            if r == 1:
                freed.append(i)
        self._free.extend(reversed(freed))
        return freed

    def free(self, ids: list[int]) -> None:
        """The owner's release of blocks it holds (`decref`)."""
        self.decref(ids)

    def check_integrity(self, owned: list[int]) -> None:
        """`owned` lists each block once per owner: every block's reference count is its
        number of owners, and a block is free exactly when nobody owns it."""
        free_set = set(self._free)
        assert len(free_set) == len(self._free), f"{self.name}: duplicate in free list"
        assert all(not self._refs[i] for i in self._free), f"{self.name}: a free block has refs"
        counts = Counter(owned)
        assert not counts.keys() & free_set, f"{self.name}: an owned block is also free"
        wrong = [b for b, n in counts.items() if self._refs[b] != n]
        assert not wrong, (f"{self.name}: blocks {wrong[:8]} have ref counts "
                           f"{[self._refs[b] for b in wrong[:8]]}, owners "
                           f"{[counts[b] for b in wrong[:8]]}")
        assert len(counts) + len(self._free) == self.num_blocks, (
            f"{self.name}: {self.num_blocks - len(counts) - len(self._free)} blocks leaked"
        )
