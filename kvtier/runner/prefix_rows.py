"""Dropped prefixes whose top layer groups wait in the host pool (Placement.HOST inside the
dropped prefix): the batch without the prefix rows above the last recomputed layer, and the
window of copied groups in flight at once (`ModelRunner.prefix_host_groups`,
`prefix_copy_window`: set by the memory system that drops prefixes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvtier.attention.metadata import AttentionMetadata
from kvtier.core.plan import BlockCopy
from kvtier.runner.host_batch import HostBatch

if TYPE_CHECKING:
    from kvtier.runner.model_runner import ModelRunner


def prefix_truncation(runner: ModelRunner, batch: HostBatch, meta: AttentionMetadata
                       ) -> tuple[int, AttentionMetadata] | None:
    """Offloaded dropped prefixes: (the first layer whose prefix KV is copied in, the
    metadata of the batch without the prefix rows), or None."""
    h = runner.prefix_host_groups
    if not h or not batch.num_prefix_rows:
        return None
    b = batch.num_reqs - batch.num_prefix_rows
    n = int(batch.query_start_loc[b])
    short = AttentionMetadata(
        num_tokens=n, num_reqs=b, num_decodes=min(meta.num_decodes, b),
        max_query_len=int(batch.query_lens[:b].max()),
        max_seq_len=int(batch.seq_lens[:b].max()),
        query_start_loc=meta.query_start_loc[: b + 1], seq_lens=meta.seq_lens[:b],
        block_tables=meta.block_tables[:, :b], slot_mapping=meta.slot_mapping[:, :n],
        layers_per_block=meta.layers_per_block, block_size=meta.block_size,
        query_lens_cpu=meta.query_lens_cpu[:b], seq_lens_cpu=meta.seq_lens_cpu[:b],
        decode_order=meta.decode_order)  # decodes lead the batch, before any prefix row
    return (runner.num_groups - h) * runner.layers_per_block, short


def copy_window(runner: ModelRunner) -> int:
    """Copied groups of offloaded prefixes in flight at once (0: all)."""
    return runner.prefix_copy_window if runner.prefix_host_groups else 0


def window_prefix_copies(runner: ModelRunner, copies: list[BlockCopy]
                          ) -> tuple[list[BlockCopy], dict[int, list[tuple[int, list]]]]:
    """(copies issued with the step's own, {group: [(target group, copies)]} held back
    until that group's attention is done): the j-th copied group reuses the scratch of
    the (j-W)-th (`build_host_batch`)."""
    w = copy_window(runner)
    if not copies or not w:
        return copies, {}
    first = runner.num_groups - runner.prefix_host_groups
    now: list[BlockCopy] = []
    by_target: dict[int, list[BlockCopy]] = {}
    for c in copies:
        if c.group - first < w:
            now.append(c)
        else:
            by_target.setdefault(c.group, []).append(c)
    later: dict[int, list[tuple[int, list]]] = {}
    for g, cs in sorted(by_target.items()):
        later.setdefault(g - w, []).append((g, cs))
    return now, later

