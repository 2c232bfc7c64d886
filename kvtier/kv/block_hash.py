"""Chained content hashes of full token blocks (vLLM's block hashing).

Block j's hash covers block j-1's hash, block j's token ids and an extra key (anything
besides the tokens that keys the KV: the request's cache salt, kvtier/kv/prefix_cache.py),
so two requests whose block-j hashes are equal have equal first (j+1) * block_size tokens
(and equal salts).
Only full blocks are hashed: a partial block's content still changes.

        block 0            block 1            block 2
      [t0 .. t15]        [t16 .. t31]       [t32 .. t47]
  ROOT --h0=H(ROOT,..)-->  h1=H(h0,..)  -->   h2=H(h1,..)

Two functions, as vLLM's `--prefix-caching-hash-algo` offers: "sha256" (the default: a
collision would hand a request another prompt's KV, and Python's `hash` of a tuple of ints
is easy to collide on purpose) and "builtin" (Python's 64-bit `hash`, a few times cheaper,
for trusted workloads).
"""

from __future__ import annotations

import hashlib
import pickle
from array import array
from collections.abc import Callable, Hashable, Sequence
from typing import Literal

from kvtier.core.request import Request

BlockHash = bytes | int
HashAlgo = Literal["sha256", "builtin"]
HASH_ALGOS: tuple[HashAlgo, ...] = ("sha256", "builtin")

# Fixed roots, not random ones: hashes are stable across processes (a host tier or a second
# engine can share them), and tests can state them.
_SHA256_ROOT = hashlib.sha256(b"kvtier prefix cache root").digest()
_BUILTIN_ROOT = 0


def sha256_block_hash(parent: BlockHash, token_ids: Sequence[int], extra: Hashable) -> bytes:
    h = hashlib.sha256(parent)  # type: ignore[arg-type]
    # Full blocks only, so the token bytes have one fixed length: no separator needed.
    h.update(array("q", token_ids))
    if extra is not None:
        h.update(pickle.dumps(extra, protocol=5))
    return h.digest()


def builtin_block_hash(parent: BlockHash, token_ids: Sequence[int], extra: Hashable) -> int:
    return hash((parent, tuple(token_ids), extra))


_FUNCTIONS: dict[str, tuple[Callable[[BlockHash, Sequence[int], Hashable], BlockHash],
                            BlockHash]] = {
    "sha256": (sha256_block_hash, _SHA256_ROOT),
    "builtin": (builtin_block_hash, _BUILTIN_ROOT),
}


class BlockHasher:
    """Hashes a request's full token blocks, appending to a list the caller keeps, so each
    block is hashed once in the request's life (preemption does not change its tokens)."""

    def __init__(self, block_size: int, algo: HashAlgo = "sha256"):
        if algo not in _FUNCTIONS:
            raise ValueError(f"unknown prefix-caching hash algo {algo!r}; "
                             f"available: {', '.join(HASH_ALGOS)}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.block_size, self.algo = block_size, algo
        self._fn, self.root = _FUNCTIONS[algo]

    def extend(self, hashes: list[BlockHash], req: Request, num_blocks: int,
               extra: Hashable = None) -> None:
        """Append the hashes of `req`'s token blocks len(hashes) .. num_blocks-1 (each must
        be full of known token ids)."""
        size, fn = self.block_size, self._fn
        assert num_blocks * size <= req.num_tokens, "only full blocks of known tokens"
        parent = hashes[-1] if hashes else self.root
        prompt, n_prompt = req.prompt_token_ids, len(req.prompt_token_ids)
        for j in range(len(hashes), num_blocks):
            start, end = j * size, (j + 1) * size
            tokens = prompt[start:end] if end <= n_prompt else req.token_ids_slice(start, end)
            parent = fn(parent, tokens, extra)
            hashes.append(parent)

    def hash_tokens(self, token_ids: Sequence[int], extra: Hashable = None) -> list[BlockHash]:
        """The chain of hashes of the full blocks of `token_ids` (tests, tools)."""
        size, out = self.block_size, []
        parent = self.root
        for j in range(len(token_ids) // size):
            parent = self._fn(parent, token_ids[j * size : (j + 1) * size], extra)
            out.append(parent)
        return out
