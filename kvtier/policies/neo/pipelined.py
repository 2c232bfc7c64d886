"""NEO's asymmetric pipelining of one step: batch 1 (the CPU decodes, the step's leading
rows) and batch 0 (the rest) go through the model as two sub-batches. Per layer l:

    GPU:  b1 norm+qkv(l) | b0 layer l (norm, qkv, attention, o, MLP) | b1 o+MLP(l) | ...
    CPU:                 | b1 attention(l), on the worker thread     |

so batch 1's CPU attention runs under batch 0's whole layer on the GPU (the main thread
only launches batch 0's kernels, then waits for the worker). Rows are independent outside
attention, and batch 0's attention over the device pool is the backend's with its own
metadata, so the outputs are the sequential step's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kvtier.attention.metadata import AttentionMetadata
from kvtier.model.llama import DecoderLayer, ForwardContext

if TYPE_CHECKING:
    from kvtier.policies.neo.runner_side import CpuRows


def rows_after(meta: AttentionMetadata, n: int) -> AttentionMetadata | None:
    """The metadata of rows [n, num_reqs) (the first n are decodes: tokens [0, n))."""
    if n >= meta.num_reqs:
        return None
    q_lens, s_lens = meta.query_lens_cpu[n:], meta.seq_lens_cpu[n:]
    return AttentionMetadata(
        num_tokens=meta.num_tokens - n, num_reqs=meta.num_reqs - n,
        num_decodes=meta.num_decodes - n, max_query_len=max(q_lens), max_seq_len=max(s_lens),
        query_start_loc=meta.query_start_loc[n:] - n, seq_lens=meta.seq_lens[n:],
        block_tables=meta.block_tables[:, n:], slot_mapping=meta.slot_mapping[:, n:],
        layers_per_block=meta.layers_per_block, block_size=meta.block_size,
        query_lens_cpu=q_lens, seq_lens_cpu=s_lens)


def pipelined_forward(runner: Any, rows: CpuRows, input_ids: torch.Tensor,
                      positions: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
    """Final hidden states of every row ([num_tokens, hidden]), batch 1's rows first."""
    n, model, ops = rows.num_rows, runner.model, runner.ops
    meta0 = rows_after(meta, n)
    ctx1 = ForwardContext(ops, runner.attention, runner.gpu_kv, meta, runner.cos_sin)
    ctx0 = ForwardContext(ops, runner.attention, runner.gpu_kv, meta0, runner.cos_sin) \
        if meta0 is not None else None
    pos1, pos0 = positions[:n], positions[n:]
    rope1 = ctx1.rope(pos1)
    x1, x0 = F.embedding(input_ids[:n], model.embed), F.embedding(input_ids[n:], model.embed)
    res1: torch.Tensor | None = None
    res0: torch.Tensor | None = None
    layers: list[DecoderLayer] = list(model.layers)  # type: ignore[arg-type]
    q1, k1, v1, res1 = layers[0].before_attention(x1, None, pos1, ctx1)
    for i, layer in enumerate(layers):
        pending = rows.submit(i, q1, k1, v1, layer.attn.scale, rope1)
        if ctx0 is not None:  # queued on the GPU while the worker attends for batch 1
            x0, res0 = layer(x0, res0, pos0, ctx0)
        out1, _ = pending.result()
        # Non-blocking from the pinned staging: the next layer's copy to the host orders after
        x1, res1 = layer.after_attention(out1.to(x1.device, x1.dtype, non_blocking=True),
                                         res1, ops)
        if i + 1 < len(layers):
            q1, k1, v1, res1 = layers[i + 1].before_attention(x1, res1, pos1, ctx1)
    eps = model.cfg.rms_norm_eps
    assert res1 is not None
    h1, _ = ops.fused_add_rms_norm(x1, res1, model.final_norm, eps)
    if ctx0 is None:
        return h1
    assert res0 is not None
    h0, _ = ops.fused_add_rms_norm(x0, res0, model.final_norm, eps)
    return torch.cat([h1, h0])
