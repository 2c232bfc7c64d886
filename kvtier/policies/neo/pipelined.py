"""NEO's asymmetric pipelining of one step: batch 1 (the CPU decodes, the step's leading
rows) and batch 0 (the rest) go through the model as two sub-batches. Per layer l:

    GPU:  b1 norm+qkv(l) | b0 layer l (norm, qkv, attention, o, MLP) | b1 o+MLP(l) | ...
    CPU:                 | b1 attention(l), on the worker thread     |

so batch 1's CPU attention runs under batch 0's whole layer on the GPU. Two hand-overs:

  * per layer (the default): the main thread copies q/k/v down (waiting for the stream),
    hands the layer to the worker, launches batch 0's layer and waits for the worker's
    output;
  * flagged (`--neo-flagged-pipeline`, where the step job is built, neo/graph_rows.py):
    one CPU job follows the step; per layer a kernel writes batch 1's q/k/v into pinned
    memory and raises the layer's ready flag, and a kernel before batch 1's o+MLP waits for
    the done flag, so the main thread never waits inside the step. These eager steps are
    bound by their launches on the H200, and the flags' extra kernels made them slower
    (results/policies/host_resident_neo_flags_h200_6709e73.json); a captured graph of the
    pipelined step would need them.

Rows are independent outside attention, and batch 0's attention over the device pool is
the backend's with its own metadata, so the outputs are the sequential step's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kvtier.attention.metadata import AttentionMetadata
from kvtier.model.llama import DecoderLayer, ForwardContext

if TYPE_CHECKING:
    from kvtier.attention.base import Rope
    from kvtier.policies.neo.graph_rows import CpuGraphRows
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


def per_layer(rows: CpuRows) -> Callable[..., Callable[[], torch.Tensor]]:
    """Batch 1's layer handed to the worker by the main thread; the output once it ran."""
    def start(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              rope: Rope) -> Callable[[], torch.Tensor]:
        pending = rows.submit(i, q, k, v, scale, rope)
        # Non-blocking from the pinned staging: the next layer's copy to the host orders
        # after it in the stream.
        return lambda: pending.result()[0].to(q.device, q.dtype, non_blocking=True)
    return start


def flagged(rows: CpuGraphRows) -> Callable[..., Callable[[], torch.Tensor]]:
    """Batch 1's layer handed to the step's CPU job through pinned flags, on the stream."""
    def start(i: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              rope: Rope) -> Callable[[], torch.Tensor]:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # contiguous rows
        rows.forward(i, q, k, v, scale, out, rope)

        def done() -> torch.Tensor:
            rows.join(i)  # a kernel that waits for the layer's done flag, then reads out
            return out
        return done
    return start


def pipelined_forward(runner: Any, rows: CpuRows, input_ids: torch.Tensor,
                      positions: torch.Tensor, meta: AttentionMetadata,
                      flag_rows: CpuGraphRows | None = None) -> torch.Tensor:
    """Final hidden states of every row ([num_tokens, hidden]), batch 1's rows first;
    batch 1's layers go to the CPU through `flag_rows` when given (flagged), else one at a
    time through `rows`."""
    if flag_rows is None:
        try:
            return _forward(runner, rows.num_rows, per_layer(rows), input_ids, positions, meta)
        except BaseException:
            rows.drain()  # batch 1's layer may still be reading the step's buffers
            raise
    flag_rows.begin()  # the step's CPU job, waiting for layer 0's flag
    failed = True
    try:
        out = _forward(runner, rows.num_rows, flagged(flag_rows), input_ids, positions, meta)
        failed = False
    finally:
        flag_rows.end(failed)
    return out


def _forward(runner: Any, n: int, start: Callable[..., Callable[[], torch.Tensor]],
             input_ids: torch.Tensor, positions: torch.Tensor,
             meta: AttentionMetadata) -> torch.Tensor:
    model, ops = runner.model, runner.ops
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
        out1 = start(i, q1, k1, v1, layer.attn.scale, rope1)
        if ctx0 is not None:  # queued on the GPU while the CPU attends for batch 1
            x0, res0 = layer(x0, res0, pos0, ctx0)
        x1, res1 = layer.after_attention(out1(), res1, ops)
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
