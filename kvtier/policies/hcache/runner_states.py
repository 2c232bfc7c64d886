"""HCache in the runner: store every computed token's per-layer hidden states in the host
hidden pool, and rebuild a resumed request's KV from them.

Capture: each layer's attention input is copied, as the forward runs, into a staging
buffer on the device laid out [token, layer, hidden], so that one token's hidden states of
every layer are one contiguous row. The host pool is laid out the same way per slot,
[block, offset, layer, hidden]: a request's consecutive tokens inside one block are one
contiguous range of it, and after the forward each such range goes to the pinned pool in
one non-blocking device-to-host copy, in stream order. No host scatter and no sync per step:
staging per layer on the host and scattering rows with advanced indexing on the CPU runs far
below PCIe speed and stalls every step (results/serving/bench_13b_4policies_h200_adaptive4096/).
Restore: per layer, the hidden rows go to the device and the layer's K/V projection (+
k-norm, rotary) writes its KV blocks; it reads the host pool, so it first waits for the
copies of the last store.
A request's hidden table starts at its first computed token block (`first_block`: the
blocks before it are a prefix cache hit's, with no hidden states): column c of its row is
token block first_block + c.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from kvtier.attention.torch_backend import write_kv
from kvtier.core.plan import HiddenBlocks, HiddenRestore, ScheduledRequest
from kvtier.model.llama import DecoderLayer, LlamaForCausalLM
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.host_batch import HostBatch


class HiddenStates:
    def __init__(self, model: LlamaForCausalLM, num_blocks: int, block_size: int,
                 max_reqs: int, max_blocks: int, max_tokens: int, dtype: torch.dtype,
                 device: torch.device):
        cfg = model.cfg
        self.model, self.block_size, self.device = model, block_size, device
        pin = device.type == "cuda"
        self.pool = torch.empty((num_blocks, block_size, cfg.num_layers, cfg.hidden_size),
                                dtype=dtype, pin_memory=pin)
        self._slots = self.pool.view(num_blocks * block_size, cfg.num_layers, cfg.hidden_size)
        self.staging = torch.empty((max_tokens, cfg.num_layers, cfg.hidden_size), dtype=dtype,
                                   device=device)
        self.tables = BlockTables(1, max_reqs, max_blocks)
        self.first_block = np.zeros(max_reqs, dtype=np.int64)  # per row
        self._num_tokens = 0
        self._stored: torch.cuda.Event | None = None  # after the last store's copies

    def forget(self, request_id: str) -> None:
        self.tables.remove(request_id)

    def apply(self, blocks: Sequence[HiddenBlocks]) -> None:
        """The plan's new hidden-state blocks per request."""
        for b in blocks:
            row = self.tables.apply_ids(b.request_id, (b.block_ids,), b.reset)
            if b.reset:
                self.first_block[row] = b.first_block

    def sink(self, num_tokens: int):
        """The model's per-layer hook for this step's `num_tokens` main rows."""
        self._num_tokens = num_tokens

        def keep(layer: int, x: torch.Tensor) -> None:
            self.staging[:num_tokens, layer].copy_(x[:num_tokens])

        return keep

    def store(self, scheduled: list[ScheduledRequest], batch: HostBatch) -> None:
        """After the step's forward: each run of tokens that are consecutive both in the
        batch and in one hidden block goes to the pool in one copy."""
        n = self._num_tokens
        q_lens = batch.query_lens[: len(scheduled)]
        rows = np.repeat([self.tables.row_of[sr.request_id] for sr in scheduled], q_lens)
        bs = self.block_size
        pos = batch.positions[:n] - self.first_block[rows] * bs  # in the hidden table
        # Coverage may run out (and starts after a prefix cache hit).
        tok = np.flatnonzero((pos >= 0) & (pos < self.tables.num_blocks[rows] * bs))
        if not len(tok):
            return
        pos = pos[tok]
        slot = (self.tables.table[0, rows[tok], pos // bs].astype(np.int64) * bs + pos % bs)
        # A run breaks where the token or the slot is not the previous one plus one.
        starts = np.flatnonzero(np.r_[True, (np.diff(tok) != 1) | (np.diff(slot) != 1)])
        ends = np.r_[starts[1:], len(tok)]
        non_blocking = self.device.type == "cuda"
        for a, b in zip(starts.tolist(), ends.tolist()):
            t0, s0 = int(tok[a]), int(slot[a])
            self._slots[s0 : s0 + b - a].copy_(self.staging[t0 : t0 + b - a],
                                               non_blocking=non_blocking)
        if non_blocking:
            self._stored = torch.cuda.Event()
            self._stored.record()

    def restore(self, restores: Sequence[HiddenRestore], block_tables: BlockTables,
                gpu_kv: torch.Tensor, ops, cos_sin: torch.Tensor, layers_per_block: int) -> None:
        """All of this step's restores together: per layer one gather of hidden rows, one
        host-to-device copy, one K/V projection GEMM and one KV write."""
        if not restores:
            return
        if self._stored is not None:  # the host pool's rows of the last store have landed
            self._stored.synchronize()
        bs = self.block_size
        # Per restored token: its hidden (block, offset), its position, its block-table row.
        hid_rows, positions, kv_rows = [], [], []
        for r in restores:
            pos = np.arange(r.first_token, r.first_token + r.num_tokens)
            hrow = self.tables.row_of[r.request_id]
            rel = pos - self.first_block[hrow] * bs
            assert rel.min(initial=0) >= 0, "restoring tokens that have no hidden states"
            hid_rows.append(self.tables.table[0, hrow, rel // bs].astype(np.int64) * bs + rel % bs)
            positions.append(pos)
            kv_rows.append(np.full(r.num_tokens, block_tables.row_of[r.request_id]))
        hid = np.concatenate(hid_rows)
        hid_blocks, hid_offsets = torch.from_numpy(hid // bs), torch.from_numpy(hid % bs)
        pos_np, rows = np.concatenate(positions), np.concatenate(kv_rows)
        pos_dev = torch.from_numpy(pos_np).to(self.device)
        for layer_idx, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            x = self.pool[hid_blocks, hid_offsets, layer_idx]  # [tokens, hidden]: only these rows
            k, v = layer.attn.project_kv(x.to(self.device, non_blocking=True), pos_dev, ops, cos_sin)
            group, slot = divmod(layer_idx, layers_per_block)
            blocks = block_tables.table[group, rows, pos_np // bs].astype(np.int64)
            slots = torch.from_numpy(blocks * bs + pos_np % bs).to(self.device)
            write_kv(gpu_kv[:, slot], k, v, slots)
