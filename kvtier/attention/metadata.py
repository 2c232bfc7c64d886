"""What the runner tells attention about one step: the batch layout and where KV lives.

KV layout (device and host pools share it):

    kv_cache: [num_blocks, F, 2, block_size, num_kv_heads, head_dim]
                            ^  ^-- 0 = K, 1 = V
                            '----- layer slot within the block's layer group

Layer `l` lives in layer group `g = l // F`, slot `i = l % F`. Every request has one block
table per layer group, so `block_tables[g, b, j]` is the physical block that holds tokens
`[j*block_size, (j+1)*block_size)` of request `b` for layers `g*F .. g*F+F-1`. With F equal
to the number of layers this is vLLM's layout (one table); kvtier's default is F = 4.

A layer's view is `kv_cache[:, i]`: [num_blocks, 2, block_size, num_kv_heads, head_dim],
strided (K of one block-layer is block_size*H*D contiguous elements).

Batch layout: requests are packed back to back in the token dimension; request b's new
tokens are `query_start_loc[b]:query_start_loc[b+1]` and sit at absolute positions
`seq_lens[b] - query_len_b .. seq_lens[b] - 1`. Decode requests (query_len == 1) come first:
`num_decodes` of them, so kernels can split the batch without a host sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from kvtier.attention.base import ExternalRows


@dataclass
class AttentionMetadata:
    num_tokens: int
    num_reqs: int
    num_decodes: int  # the first num_decodes requests have exactly one query token
    max_query_len: int
    max_seq_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, on device
    seq_lens: torch.Tensor  # [num_reqs] int32, context length after this step, on device
    block_tables: torch.Tensor  # [num_groups, num_reqs, max_blocks] int32, on device
    slot_mapping: torch.Tensor  # [num_groups, num_tokens] int64: block*block_size + offset
    layers_per_block: int  # F
    block_size: int
    # Host copies for the pure-torch path (no device sync needed to read them).
    query_lens_cpu: list[int]
    seq_lens_cpu: list[int]
    # [num_decodes] int32 permutation: the order the decode attention launches its rows in
    # (a performance hint: any order gives the same outputs). None: row order.
    decode_order: torch.Tensor | None = None
    # Leading decode rows whose KV lives outside the device pool: a memory system attends
    # for them (kvtier/attention/base.py, ExternalRows). None: every row is the backend's.
    external: ExternalRows | None = None
    # What a backend derives from this step's metadata once and reuses in every layer
    # (tensor views, launch parameters): a step issues its attention once per layer, and
    # rebuilding them each time was a measurable share of a mixed step's host time.
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False,
                                    compare=False)

    def layer_slot(self, layer_idx: int) -> tuple[int, int]:
        """(layer group, slot in block) of a layer."""
        return divmod(layer_idx, self.layers_per_block)
