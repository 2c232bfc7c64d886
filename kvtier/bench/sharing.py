"""How much of a workload's prompts a prefix cache could serve: per request, the tokens of
its prompt that are a whole-block prefix of an earlier request's prompt.

The rule is the engine's (kvtier/kv/prefix_cache.py): full blocks only, from the first; at
most `(prompt_len - 1) // block_size` blocks, since the last prompt token is always
computed. "Earlier" is workload order (a follow-up comes after the request it follows),
and an earlier request's prompt only: its generated tokens are not known before the run.
What the engine really hits can be less (a block evicted, or not yet computed when the
request came), never more, unless it reuses generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.bench.request import BenchRequest


@dataclass(frozen=True)
class PrefixSharing:
    block_size: int
    shared_tokens: tuple[int, ...]  # per request
    prompt_tokens: int

    @property
    def shared_fraction(self) -> float:
        return sum(self.shared_tokens) / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def unshared_fraction(self) -> float:
        """The fraction of prompt tokens a perfect prefix cache still computes."""
        return 1.0 - self.shared_fraction

    @property
    def num_sharing_requests(self) -> int:
        return sum(1 for n in self.shared_tokens if n)

    def to_dict(self) -> dict:
        return {"block_size": self.block_size, "prompt_tokens": self.prompt_tokens,
                "shared_prefix_tokens": sum(self.shared_tokens),
                "shared_fraction": self.shared_fraction,
                "unshared_fraction": self.unshared_fraction,
                "num_requests_sharing": self.num_sharing_requests,
                "num_requests": len(self.shared_tokens)}


def prefix_sharing(requests: Sequence[BenchRequest], block_size: int = 16) -> PrefixSharing:
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    # A block is named by (its parent's id, its tokens): exact, no hash to collide.
    ids: dict[tuple[int, tuple[int, ...]], int] = {}
    shared: list[int] = []
    for r in requests:
        tokens = r.prompt_token_ids
        parent, hit, missed = -1, 0, False
        for b in range(len(tokens) // block_size):
            key = (parent, tokens[b * block_size:(b + 1) * block_size])
            known = ids.get(key)
            if known is None:
                missed = True
                known = ids[key] = len(ids)
            elif not missed and b < (len(tokens) - 1) // block_size:
                hit += 1
            parent = known
        shared.append(hit * block_size)
    return PrefixSharing(block_size, tuple(shared), sum(r.prompt_len for r in requests))
