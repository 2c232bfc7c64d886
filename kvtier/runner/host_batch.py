"""A step's batch on the host (numpy), built from plan diffs and the persistent block tables.

Everything is vectorized: per-token arrays come from np.repeat over requests, slots from one
fancy-index into the block tables, so the cost per step grows with tokens, not Python loops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.core.plan import ScheduledRequest
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
    # eLLM: dropped-prefix rows appended after the main rows (None: no request has one)
    prefix_start_loc: np.ndarray | None = None  # [B + 1] int64, relative to the main rows

    @property
    def has_prefix(self) -> bool:
        return self.prefix_start_loc is not None

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def num_reqs(self) -> int:
        return len(self.query_lens)

    @property
    def is_decode_only(self) -> bool:
        return self.num_decodes == self.num_reqs


def build_host_batch(
    scheduled: list[ScheduledRequest], tables: BlockTables, block_size: int
) -> HostBatch:
    rows = np.fromiter((tables.apply(sr) for sr in scheduled), dtype=np.int64,
                       count=len(scheduled))
    q_lens = np.fromiter((sr.num_new_tokens for sr in scheduled), dtype=np.int64,
                         count=len(scheduled))
    starts = np.fromiter((sr.start_pos for sr in scheduled), dtype=np.int64,
                         count=len(scheduled))
    seq_lens = starts + q_lens
    cu = np.zeros(len(scheduled) + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    num_tokens = int(cu[-1])
    if num_tokens == len(scheduled):  # all decodes: skip the per-token expansion
        positions = starts
        token_rows = rows
        input_ids = np.fromiter((sr.token_ids[0] for sr in scheduled), dtype=np.int64,
                                count=num_tokens)
    else:
        token_req = np.repeat(np.arange(len(scheduled)), q_lens)
        positions = starts[token_req] + (np.arange(num_tokens) - cu[:-1][token_req])
        token_rows = rows[token_req]
        input_ids = np.fromiter((t for sr in scheduled for t in sr.token_ids), dtype=np.int64,
                                count=num_tokens)
    blocks = tables.table[:, token_rows, positions // block_size]  # [G, T]
    slots = blocks.astype(np.int64) * block_size + positions % block_size
    sample_mask = np.fromiter((sr.sample for sr in scheduled), dtype=bool, count=len(scheduled))
    not_decode = np.flatnonzero(q_lens != 1)
    batch = HostBatch(
        input_ids=input_ids, positions=positions, query_lens=q_lens, seq_lens=seq_lens,
        query_start_loc=cu, rows=rows, slots=slots, logits_idx=cu[1:][sample_mask] - 1,
        num_decodes=int(not_decode[0]) if len(not_decode) else len(scheduled),
        max_blocks=-(-int(seq_lens.max()) // block_size),
    )
    if any(sr.prefix_token_ids for sr in scheduled):
        _append_prefix_rows(batch, scheduled)
    return batch


def _append_prefix_rows(batch: HostBatch, scheduled: list[ScheduledRequest]) -> None:
    """Rows that recompute dropped prefixes: token ids 0..s-1 of each request, positions
    0..s-1, after the main rows (they own no slot: their K/V is never stored)."""
    lens = np.fromiter((len(sr.prefix_token_ids) for sr in scheduled), dtype=np.int64,
                       count=len(scheduled))
    loc = np.zeros(len(scheduled) + 1, dtype=np.int64)
    np.cumsum(lens, out=loc[1:])
    ids = np.fromiter((t for sr in scheduled for t in sr.prefix_token_ids), dtype=np.int64,
                      count=int(loc[-1]))
    positions = np.arange(int(loc[-1])) - np.repeat(loc[:-1], lens)
    batch.input_ids = np.concatenate((batch.input_ids, ids))
    batch.positions = np.concatenate((batch.positions, positions))
    batch.prefix_start_loc = loc
