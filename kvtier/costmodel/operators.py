"""Operator counts of one step: FLOPs, bytes and kernel launches of every operator the model
runs, per GPU under tensor parallelism. Pure arithmetic on the model's shapes.

One decoder layer at T tokens (the runner's `kvtier/model/llama.py`):

    fused_add_rms_norm -> qkv GEMM -> rotary -> [kv_write -> attention (decode | prefill)]
    -> o GEMM [-> all-reduce] -> fused_add_rms_norm -> gate_up GEMM -> silu*up
    -> down GEMM [-> all-reduce]

kv_write is counted with the attention operator that follows it (the attention backend
launches both, and calibration times them together). In the last layer, past its attention,
only the rows that get logits go on (`LlamaForCausalLM.forward`'s `keep`).

Per step: embedding, final norm, the lm_head GEMM over the sampled rows only, and the
sampler's fp32 logits (cast + argmax).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kvtier.config import ConfigError, ModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.distributed.sharding import TPShard


class OpKind(str, enum.Enum):
    GEMM = "gemm"
    ATTN_DECODE = "attn_decode"
    ATTN_PREFILL = "attn_prefill"
    ELEMENTWISE = "elementwise"  # norms, rotary, kv_write, silu*mul, embedding
    SAMPLE = "sample"  # fp32 logits cast and argmax
    ALLREDUCE = "allreduce"


@dataclass(frozen=True)
class Op:
    name: str
    kind: OpKind
    flops: float
    bytes: float
    launches: int = 1


@dataclass(frozen=True)
class Shapes:
    """A model's per-GPU sizes under `tp`-way tensor parallelism (heads, columns and rows of
    the MLP and the vocabulary are split; KV heads are replicated when fewer than `tp`)."""

    hidden: int
    q: int  # q columns per GPU
    kv: int  # k (= v) columns per GPU
    inter: int
    vocab: int
    heads: int
    kv_heads: int
    head_dim: int
    num_layers: int
    tp: int
    elem: int  # bytes per activation/weight element

    @classmethod
    def of(cls, mc: ModelConfig, tp: int = 1, elem: int = 2) -> Shapes:
        """The shard of rank 0 by the runner's rule (kvtier/distributed/sharding.py; every
        rank's shapes are the same)."""
        try:
            shard = TPShard(mc, 0, tp)
        except ConfigError as e:
            raise ValueError(str(e)) from None
        heads, kv_heads = shard.num_heads, shard.num_kv_heads
        return cls(mc.hidden_size, heads * mc.head_dim, kv_heads * mc.head_dim,
                   shard.intermediate, shard.vocab_per_rank, heads, kv_heads,
                   mc.head_dim, mc.num_layers, tp, elem)

    def gemm_dims(self) -> dict[str, tuple[int, int]]:
        """(N out, K in) of each GEMM, per GPU."""
        return {"qkv": (self.q + 2 * self.kv, self.hidden), "o": (self.hidden, self.q),
                "gate_up": (2 * self.inter, self.hidden), "down": (self.hidden, self.inter),
                "lm_head": (self.vocab, self.hidden)}


def gemm(name: str, m: int, n: int, k: int, elem: int) -> Op:
    """[m, k] x [k, n]: weights read once, activations in and out."""
    return Op(name, OpKind.GEMM, 2.0 * m * n * k, float(elem) * (n * k + m * k + m * n))


def attn_decode(s: Shapes, num_rows: int, ctx_sum: int) -> Op:
    # Per row at context c: QK^T and PV are 2*c*D FLOPs per query head each; K and V of
    # c tokens are read once per KV head group (the kernel shares a tile across the group).
    flops = 4.0 * s.heads * s.head_dim * ctx_sum
    kv_bytes = 2.0 * s.kv * s.elem * ctx_sum
    q_out = 2.0 * num_rows * s.q * s.elem
    kv_write = 4.0 * num_rows * s.kv * s.elem  # the new token's k, v read and stored
    # kv_write, the split-K kernel, the merge of the splits
    return Op("attn_decode", OpKind.ATTN_DECODE, flops, kv_bytes + q_out + kv_write, launches=3)


def causal_pairs(new: int, start: int) -> int:
    """(query, key) pairs of a chunk of `new` tokens after `start` cached ones."""
    return new * start + new * (new + 1) // 2


def attn_prefill(s: Shapes, prefills: tuple[tuple[int, int], ...]) -> Op:
    pairs = sum(causal_pairs(n, st) for n, st in prefills)
    tokens = sum(n for n, _ in prefills)
    ctx = sum(n + st for n, st in prefills)
    flops = 4.0 * s.heads * s.head_dim * pairs
    byts = 2.0 * s.kv * s.elem * ctx + 2.0 * tokens * s.q * s.elem + 4.0 * tokens * s.kv * s.elem
    return Op("attn_prefill", OpKind.ATTN_PREFILL, flops, byts, launches=2)


ELEMENTWISE_KERNELS = 4  # two fused add+norms, rotary, silu*up (one fused kernel)


def layer_elementwise(s: Shapes, t: int) -> Op:
    """The four bandwidth-bound kernels of a layer at t tokens, as one operator."""
    e, h = s.elem, s.hidden
    norms = 2 * 4 * t * h * e  # two fused add+norm: read x, residual; write both
    rotary = 2 * t * (s.q + s.kv) * e + t * s.head_dim * 4  # q, k in and out; fp32 cos/sin
    silu_mul = 3 * t * s.inter * e  # read gate and up, write their product
    return Op("layer_elementwise", OpKind.ELEMENTWISE, 0.0, float(norms + rotary + silu_mul),
              launches=ELEMENTWISE_KERNELS)


def layer_ops(s: Shapes, shape: StepShape, gemm_rows: int) -> list[Op]:
    """One decoder layer. `gemm_rows` is the GEMMs' M: the tokens, or a CUDA graph's
    padded batch."""
    dims = s.gemm_dims()
    ops = [layer_elementwise(s, gemm_rows)]
    ops += [gemm(name, gemm_rows, *dims[name], s.elem) for name in ("qkv", "o", "gate_up", "down")]
    if shape.num_decodes:
        ops.append(attn_decode(s, shape.num_decodes, shape.decode_ctx_sum))
    if shape.prefills:
        ops.append(attn_prefill(s, shape.prefills))
    if s.tp > 1:
        ops += [allreduce(s, gemm_rows)] * 2  # after o and after down
    return ops


def piece_copies(s: Shapes, t: int) -> tuple[Op, Op]:
    """Piecewise graphs' copies into their static buffers at t (padded) rows, inside the
    pieces: (q, k, v and the residual before attention; hidden and residual after it)."""
    e = s.elem
    before = Op("piece_copy_before", OpKind.ELEMENTWISE, 0.0,
                float(2 * t * e * (s.q + 2 * s.kv + s.hidden)), launches=4)
    after = Op("piece_copy_after", OpKind.ELEMENTWISE, 0.0, float(2 * t * e * 2 * s.hidden),
               launches=2)
    return before, after


def attn_out_copy(s: Shapes, n: int) -> Op:
    """Piecewise graphs: the attention output of the n real rows into the static buffer."""
    return Op("attn_out_copy", OpKind.ELEMENTWISE, 0.0, float(2 * n * s.q * s.elem))


def allreduce(s: Shapes, t: int) -> Op:
    """A sum of t rows of hidden states over the GPUs: after o and down, and the
    vocab-parallel embedding's."""
    return Op("allreduce", OpKind.ALLREDUCE, 0.0, float(t * s.hidden * s.elem))


def logits_gather(s: Shapes, rows: int) -> Op:
    """The vocab-parallel LM head's logits gathered on every GPU: `bytes` is the gathered
    [rows, vocab] output."""
    return Op("logits_gather", OpKind.ALLREDUCE, 0.0, float(rows * s.vocab * s.tp * s.elem))


def head_ops(s: Shapes, num_tokens: int, logit_rows: int) -> list[Op]:
    """Once per step: embedding gather, final norm, lm_head over the rows whose logits are
    computed (sampled rows; a graph's padded batch), fp32 cast and argmax."""
    e, h, v = s.elem, s.hidden, s.vocab
    embed = Op("embed", OpKind.ELEMENTWISE, 0.0, float(2 * num_tokens * h * e))
    final_norm = Op("final_norm", OpKind.ELEMENTWISE, 0.0, float(4 * num_tokens * h * e))
    ops = [embed, final_norm]
    if logit_rows:
        ops.append(gemm("lm_head", logit_rows, v, h, e))
        ops.append(Op("sample", OpKind.SAMPLE, 0.0,
                      float(logit_rows * v * (e + 4) + logit_rows * v * 4), launches=2))
    return ops


def step_ops(s: Shapes, shape: StepShape, gemm_rows: int | None = None) -> list[Op]:
    """Every operator of a step, layers expanded (for counting; the cost model times one
    layer and multiplies). The last layer's GEMMs past its attention run over the rows with
    logits only (the runner's `keep`; in a decode graph that is every row)."""
    rows = shape.num_tokens if gemm_rows is None else gemm_rows
    logit_rows = shape.num_sampled if gemm_rows is None else gemm_rows
    dims = s.gemm_dims()
    after = ("o", "gate_up", "down")
    layer = layer_ops(s, shape, rows)
    last = [op for op in layer if op.name not in after]
    last += [gemm(name, logit_rows, *dims[name], s.elem) for name in after if logit_rows]
    return layer * (s.num_layers - 1) + last + head_ops(s, rows, logit_rows)


def totals(ops: list[Op]) -> tuple[float, float]:
    """(FLOPs, bytes) of a list of operators."""
    return sum(o.flops for o in ops), sum(o.bytes for o in ops)
