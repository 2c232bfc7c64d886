"""HCache in the runner: store every computed token's per-layer hidden states in the host
hidden pool, and rebuild a resumed request's KV from them.

Capture: each layer's attention input is copied (asynchronously, into a pinned staging
buffer on GPU machines) as the forward runs; after the step it is scattered into the
request's hidden blocks [block, layer, offset, hidden]. Restore: per layer, the hidden rows
go to the device and the layer's K/V projection (+ k-norm, rotary) writes its KV blocks.
"""

from __future__ import annotations

import numpy as np
import torch

from kvtier.attention.torch_backend import write_kv
from kvtier.core.plan import HiddenRestore, ScheduledRequest
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
        self.pool = torch.empty((num_blocks, cfg.num_layers, block_size, cfg.hidden_size),
                                dtype=dtype, pin_memory=pin)
        self.staging = torch.empty((cfg.num_layers, max_tokens, cfg.hidden_size), dtype=dtype,
                                   pin_memory=pin)
        self.tables = BlockTables(1, max_reqs, max_blocks)
        self._num_tokens = 0

    def forget(self, request_id: str) -> None:
        self.tables.remove(request_id)

    def apply(self, scheduled: list[ScheduledRequest]) -> None:
        for sr in scheduled:
            self.tables.apply_ids(sr.request_id, (sr.new_hidden_ids,), sr.reset_blocks)

    def sink(self, num_tokens: int):
        """The model's per-layer hook for this step's `num_tokens` main rows."""
        self._num_tokens = num_tokens

        def keep(layer: int, x: torch.Tensor) -> None:
            self.staging[layer, :num_tokens].copy_(x[:num_tokens], non_blocking=True)

        return keep

    def store(self, scheduled: list[ScheduledRequest], batch: HostBatch) -> None:
        """After the step's forward: scatter the staged rows into their hidden blocks."""
        if self.device.type == "cuda":
            torch.cuda.current_stream(self.device).synchronize()  # staging copies landed
        n = self._num_tokens
        q_lens = batch.query_lens[: len(scheduled)]
        rows = np.repeat([self.tables.row_of[sr.request_id] for sr in scheduled], q_lens)
        pos = batch.positions[:n]
        bs = self.block_size
        covered = pos < self.tables.num_blocks[rows] * bs  # coverage may have run out
        blocks = self.tables.table[0, rows, np.minimum(pos // bs, self.tables.table.shape[2] - 1)]
        keep = torch.from_numpy(np.flatnonzero(covered))
        b = torch.from_numpy(blocks[covered].astype(np.int64))
        o = torch.from_numpy((pos[covered] % bs).astype(np.int64))
        self.pool[b, :, o] = self.staging[:, :n].index_select(1, keep).transpose(0, 1)

    def restore(self, restores: list[HiddenRestore], block_tables: BlockTables,
                gpu_kv: torch.Tensor, ops, cos_sin: torch.Tensor, layers_per_block: int) -> None:
        """All of this step's restores together: per layer one gather of hidden rows, one
        host-to-device copy, one K/V projection GEMM and one KV write."""
        if not restores:
            return
        bs = self.block_size
        # Per restored token: its hidden (block, offset), its position, its block-table row.
        hid_rows, positions, kv_rows = [], [], []
        for r in restores:
            pos = np.arange(r.num_tokens)
            hrow = self.tables.row_of[r.request_id]
            hid_rows.append(self.tables.table[0, hrow, pos // bs].astype(np.int64) * bs + pos % bs)
            positions.append(pos)
            kv_rows.append(np.full(r.num_tokens, block_tables.row_of[r.request_id]))
        hid = np.concatenate(hid_rows)
        hid_blocks, hid_offsets = torch.from_numpy(hid // bs), torch.from_numpy(hid % bs)
        pos_np, rows = np.concatenate(positions), np.concatenate(kv_rows)
        pos_dev = torch.from_numpy(pos_np).to(self.device)
        for layer_idx, layer in enumerate(self.model.layers):
            assert isinstance(layer, DecoderLayer)
            x = self.pool[hid_blocks, layer_idx, hid_offsets]  # [tokens, hidden]: only these rows
            k, v = layer.attn.project_kv(x.to(self.device, non_blocking=True), pos_dev, ops, cos_sin)
            group, slot = divmod(layer_idx, layers_per_block)
            blocks = block_tables.table[group, rows, pos_np // bs].astype(np.int64)
            slots = torch.from_numpy(blocks * bs + pos_np % bs).to(self.device)
            write_kv(gpu_kv[:, slot], k, v, slots)
