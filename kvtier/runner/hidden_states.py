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
        bs = self.block_size
        for r in restores:
            n = r.num_tokens
            hrow, row = self.tables.row_of[r.request_id], block_tables.row_of[r.request_id]
            hidden_blocks = torch.from_numpy(self.tables.table[0, hrow, : -(-n // bs)].astype(np.int64))
            pos = np.arange(n)
            positions = torch.from_numpy(pos).to(self.device)
            for layer_idx, layer in enumerate(self.model.layers):
                assert isinstance(layer, DecoderLayer)
                x = self.pool[hidden_blocks, layer_idx].reshape(-1, self.pool.shape[-1])[:n]
                k, v = layer.attn.project_kv(x.to(self.device), positions, ops, cos_sin)
                group, slot = divmod(layer_idx, layers_per_block)
                slots = block_tables.table[group, row, pos // bs].astype(np.int64) * bs + pos % bs
                write_kv(gpu_kv[:, slot], k, v, torch.from_numpy(slots).to(self.device))
