"""A step's batch on the host (numpy), built from plan diffs and the persistent block tables.

Everything is vectorized: per-token arrays come from np.repeat over requests, slots from one
fancy-index into the block tables, so the cost per step grows with tokens, not Python loops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

import numpy as np

from kvtier.core.plan import BlockCopy, RecomputePrefix, ScheduledRequest
from kvtier.runner.block_tables import BlockTables


@dataclass
class HostBatch:
    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    query_lens: np.ndarray  # [B] int64
    seq_lens: np.ndarray  # [B] int64
    query_start_loc: np.ndarray  # [B + 1] int64
    rows: np.ndarray  # [B] block-table rows
    slots: np.ndarray  # [G, T] int64
    logits_idx: np.ndarray  # [num sampling requests] token index of each one's last token
    num_decodes: int
    max_blocks: int  # block-table columns the batch needs
    # Rows recomputing dropped prefixes (last in the batch), and the copies that bring
    # the offloaded part of those prefixes (top layer groups) from the host into scratch.
    num_prefix_rows: int = 0
    prefix_copies: list[BlockCopy] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def decode_order(self) -> np.ndarray:
        """[num_decodes] int32: the decode rows, longest context first (`longest_first`)."""
        return longest_first(self.seq_lens[: self.num_decodes])

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == self.num_reqs


# C-level field getters: the per-request lists below are built without Python frames.
_token_ids, _start_pos = attrgetter("token_ids"), attrgetter("start_pos")
_sample = attrgetter("sample")
_first = itemgetter(0)


def build_host_batch(
    scheduled: list[ScheduledRequest], tables: BlockTables, block_size: int,
    scratch: range = range(0), copy_window: int = 0, prefixes: Sequence[RecomputePrefix] = (),
) -> HostBatch:
    """`prefixes`: the step's dropped prefixes to recompute (the plan's RecomputePrefix
    items); `scratch`: device blocks lent to their recomputation this step. `copy_window`:
    scratch sets the copied-in groups of offloaded prefixes share (the j-th copied group
    uses set j % copy_window; 0: one set per group)."""
    rows = tables.apply_all(scheduled)
    token_ids = list(map(_token_ids, scheduled))
    starts = list(map(_start_pos, scheduled))
    sample = list(map(_sample, scheduled))
    copies: list[BlockCopy] = []
    num_main = len(rows)
    if prefixes:
        copies = _add_prefix_rows(scheduled, prefixes, rows, token_ids, starts, sample, tables,
                                  block_size, scratch, copy_window)
    batch = _batch(np.asarray(rows, dtype=np.int64), token_ids,
                   np.asarray(starts, dtype=np.int64), np.asarray(sample, dtype=bool), tables,
                   block_size)
    batch.num_prefix_rows, batch.prefix_copies = len(rows) - num_main, copies
    return batch


def _add_prefix_rows(scheduled, prefixes, rows, token_ids, starts, sample, tables: BlockTables,
                     block_size: int, scratch: range, copy_window: int = 0) -> list[BlockCopy]:
    """A request whose KV prefix [0, s) was dropped gets it recomputed this step (its
    prefix rows follow the batch in the order of the requests' rows).

    Its prefix tokens join the batch as one more prefill-like entry (positions 0..s-1, no
    sampling) over the same block-table row, whose first s/B columns now point at scratch
    blocks. Every layer writes the prefix K/V into its own slot of those blocks and reads
    it back at once: the request's attention sees scratch [0, s) + cached [s, n) through
    the ordinary paged kernels, and layer l+F overwrites layer l's slot only after layer l
    is done, so s tokens of one layer group is all the memory the recompute needs.

    Layer groups whose prefix KV waits in the host pool (`host_blocks`) get scratch
    blocks of their own instead, which the returned copies fill while the lower groups
    compute; the prefix rows stop before those groups (the runner truncates the batch).
    With a copy window W, copied groups share W sets of scratch: the j-th one reuses the set
    of the (j-W)-th, so the runner holds its copy back until that group's attention is done.
    """
    nxt = scratch.start
    copies: list[BlockCopy] = []

    def lend(k: int) -> range:
        nonlocal nxt
        if nxt + k > scratch.stop:
            raise RuntimeError("dropped prefixes exceed the recompute scratch blocks")
        nxt += k
        return range(nxt - k, nxt)

    index = {sr.request_id: i for i, sr in enumerate(scheduled)}
    for p in sorted(prefixes, key=lambda p: index[p.request_id]):
        i = index[p.request_id]
        k = len(p.token_ids) // block_size
        if not k:
            continue
        tables.point_prefix(rows[i], lend(k))
        sets: list[range] = []
        copied = [g for g, host_blocks in enumerate(p.host_blocks) if host_blocks]
        for j, g in enumerate(copied):
            if copy_window and j >= copy_window:
                dst = sets[j % copy_window]
            else:
                dst = lend(k)
                sets.append(dst)
            tables.point_prefix(rows[i], dst, group=g)
            copies += [BlockCopy(src=h, dst=d, group=g)
                       for h, d in zip(p.host_blocks[g], dst)]
        rows.append(rows[i])
        token_ids.append(p.token_ids)
        starts.append(0)
        sample.append(False)
    return copies


def _batch(rows: np.ndarray, token_ids: list[list[int]], starts: np.ndarray,
           sample_mask: np.ndarray, tables: BlockTables, block_size: int) -> HostBatch:
    n = len(rows)
    q_lens = np.fromiter(map(len, token_ids), dtype=np.int64, count=n)
    seq_lens = starts + q_lens
    cu = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    num_tokens = int(cu[-1])
    if num_tokens == n:  # all decodes: skip the per-token expansion
        positions = starts
        token_rows = rows
        input_ids = np.fromiter(map(_first, token_ids), dtype=np.int64, count=num_tokens)
    else:
        token_req = np.repeat(np.arange(n), q_lens)
        positions = starts[token_req] + (np.arange(num_tokens) - cu[:-1][token_req])
        token_rows = rows[token_req]
        input_ids = np.fromiter((t for ids in token_ids for t in ids), dtype=np.int64,
                                count=num_tokens)
    blocks = tables.table[:, token_rows, positions // block_size]  # [G, T]
    slots = blocks.astype(np.int64) * block_size + positions % block_size
    not_decode = np.flatnonzero(q_lens != 1)
    return HostBatch(
        input_ids=input_ids, positions=positions, query_lens=q_lens, seq_lens=seq_lens,
        query_start_loc=cu, rows=rows, slots=slots, logits_idx=cu[1:][sample_mask] - 1,
        num_decodes=int(not_decode[0]) if len(not_decode) else n,
        max_blocks=-(-int(seq_lens.max()) // block_size),
    )


def longest_first(seq_lens: np.ndarray) -> np.ndarray:
    """The order in which the decode attention launches its rows (int32): longest context
    first. Programs start roughly in id order, so a long context left to the last wave
    keeps the kernel running after the rest are done; on the offline ShareGPT run's
    contexts this order shortens the head-fastest kernel (results/kernels/
    kernels_sharegpt_context_h200_{base,order}_{1,2}.json)."""
    return np.argsort(-seq_lens, kind="stable").astype(np.int32)


def pad_rows(idx: np.ndarray, sizes: list[int]) -> np.ndarray:
    """`idx` padded to the smallest of `sizes` that holds it by repeating its last entry
    (unchanged when it is empty or larger than every size)."""
    size = next((s for s in sizes if s >= len(idx)), len(idx))
    return np.pad(idx, (0, size - len(idx)), mode="edge") if len(idx) and size > len(idx) else idx
