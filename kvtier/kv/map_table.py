"""Per-request map table: (layer group, token block) -> placement + physical block.

        token block j:   0      1      2      3
        group 0        [G:12] [G:40] [G:41] [G:7 ]   <- layers 0..F-1
        group 1        [G:3 ] [G:9 ] [G:13] [G:2 ]   <- layers F..2F-1
        ...
A block of group g, token block j holds tokens [j*B, (j+1)*B) of layers gF..gF+F-1;
#filled of entry j is min(B, num_stored_tokens - j*B). Placements say where it lives;
`recompute`/`swap` move whole requests, later policies move single entries.
"""

from __future__ import annotations

import enum


class Placement(enum.Enum):
    GPU = "gpu"
    HOST = "host"
    HIDDEN = "hidden"  # hidden states kept, KV re-projected
    DROPPED = "dropped"  # recomputed from token ids


class MapTable:
    def __init__(self, num_groups: int):
        self.block_ids: list[list[int]] = [[] for _ in range(num_groups)]
        self.placements: list[list[Placement]] = [[] for _ in range(num_groups)]
        # Token blocks [0, k) are missing from the device in every group: DROPPED, except in
        # the last `num_host_groups` groups, whose prefix KV waits in the host pool
        # (layer-level overlap: copied in each step while the lower groups recompute).
        self.num_dropped_blocks = 0
        self.num_host_groups = 0

    @property
    def num_token_blocks(self) -> int:
        return len(self.block_ids[0])

    def truncate(self, num_token_blocks: int) -> None:
        """Forget every entry from token block `num_token_blocks` on, in every group."""
        for ids, pls in zip(self.block_ids, self.placements):
            del ids[num_token_blocks:], pls[num_token_blocks:]

    def append(self, group: int, block_id: int, placement: Placement) -> None:
        self.block_ids[group].append(block_id)
        self.placements[group].append(placement)

    def entries(self, placement: Placement) -> list[tuple[int, int, int]]:
        """(group, token block, physical block) of every entry with this placement."""
        return [
            (g, j, b)
            for g, (ids, pls) in enumerate(zip(self.block_ids, self.placements))
            for j, (b, p) in enumerate(zip(ids, pls))
            if p is placement
        ]

    def num_filled(self, token_block: int, num_stored_tokens: int, block_size: int) -> int:
        return max(0, min(block_size, num_stored_tokens - token_block * block_size))
