"""The cost model: a step plan in, its predicted wall time out.

    step = copies (swap out, then in; with overlap_swap only the bubble, see below)
         + decode-only and graph-eligible:  host_graph(B) + L * layer(B_pad) + head(B_pad)
           piecewise graphs on, T <= max:   host_eager(B, T) + queue(pieces at T_pad,
                                                                     attention at the real rows)
           otherwise (eager):               host_eager(B, T) + overlap(launches, kernels)
         + sample(S)                        (argmax over the logits, the host sync)
    loop = schedule + update + outputs      (the engine loop around the executor)

`layer` is the sum of the layer's operator times (GEMMs at the padded batch, decode and
prefill attention, elementwise kernels, all-reduces under tensor parallelism); in eager mode
the same kernels go through the launch queue of `overlap.py`.

Piecewise (`kvtier/runner/piecewise_graphs.py`, when the engine runs with piecewise_graphs
and CUDA graphs): a step that is not a decode graph replay runs the embedding and input
copies eagerly, then per layer the eager attention (kv_write, the split-K decode wrapper for
the decode rows, the varlen prefill wrapper for the prefill rows, each at the real shapes),
one copy of its output into a static buffer and one graph replay: piece k = layer k-1 after
its attention + layer k before its own, its GEMMs and elementwise kernels at the padded
token count `t` from `piecewise_sizes`; L+1 replays in all, then final norm and lm_head
eagerly. The last piece (the last layer after its attention) runs at the padded count of the
rows with logits, gathered after the last attention (the runner's `keep`; the eager path
prices the same). These launches go through the same queue (`overlap.queue_seconds`), each with its
own host cost (HostParams.replay_s, attn_*_s, op_launch_s, and piece_layer_s a layer for the
Python between them) and a replay's device time the sum of its piece's kernels.

Swap overlap (`overlap_swap`, EngineConfig's): the runner copies on a stream of its own, layer
group by layer group, and the forward waits for group g's swap-ins only before group g's
first attention; so an eager or piecewise step pays for its copies only the bubble of
`overlap.swap_overlap_seconds` (group 0's copies and the swap-outs always, the rest as far as
they outrun the earlier groups' compute). A full-graph replay cannot wait mid-graph: decode
steps with swap-ins are priced as the runner runs them, piecewise when pieces are captured,
else a graph replay after all copies (serial, as without overlap).
"""

from __future__ import annotations

from kvtier.config import ModelConfig
from kvtier.core.graph_sizes import graph_batch_sizes, piecewise_sizes
from kvtier.core.items import kind_named, step_pricer
from kvtier.core.plan import StepPlan
from kvtier.costmodel.calibration import Calibration, HostParams, LoopParams, model_dims
from kvtier.costmodel.hardware import CopyCost, CopyMechanism, HardwareProfile
from kvtier.costmodel.operators import (
    ELEMENTWISE_KERNELS,
    Shapes,
    allreduce,
    attn_out_copy,
    gemm,
    head_ops,
    layer_elementwise,
    logits_gather,
    piece_copies,
)
from kvtier.costmodel.optimes import OpTimer
from kvtier.costmodel.overlap import (
    Launch,
    forward_seconds,
    queue_seconds,
    swap_overlap_seconds,
)
from kvtier.costmodel.settings import CostModelConfig, engine_cost_config
from kvtier.costmodel.shape import StepShape
from kvtier.costmodel.step_cost import StepCost

__all__ = ["CostModel", "CostModelConfig", "StepCost", "engine_cost_config"]

_LAYER_GEMMS = ("qkv", "o", "gate_up", "down")
DECODE_LAUNCHES = 3  # kv_write, split-K attention, merge of the splits
PREFILL_LAUNCHES = 2  # kv_write, varlen attention


class CostModel:
    def __init__(self, mc: ModelConfig, hw: HardwareProfile, calib: Calibration | None = None,
                 config: CostModelConfig = CostModelConfig()):
        if calib is not None:
            _check_calibration(mc, calib)
        self.mc, self.hw, self.calib, self.config = mc, hw, calib, config
        self.shapes = Shapes.of(mc, config.num_gpus)
        self.timer = OpTimer(hw, self.shapes, calib)
        self.host = calib.host if calib is not None else HostParams()
        self.loop = calib.loop if calib is not None else LoopParams()
        self.graph_sizes = (graph_batch_sizes(config.max_num_seqs, config.max_graph_batch_size)
                            if config.cuda_graphs and config.decode_graphs else [])
        self.piece_sizes = (piecewise_sizes(config.max_num_batched_tokens)
                            if config.cuda_graphs and config.piecewise_graphs else [])

    # ---- entry points ------------------------------------------------------------------------
    def predict_plan(self, plan: StepPlan) -> StepCost:
        return self.predict(StepShape.from_plan(plan))

    def predict(self, shape: StepShape) -> StepCost:
        whole = step_pricer(shape.items) if shape.items else None  # a system prices it all
        if whole is not None:
            return whole(self, shape)
        parts = {"copies": self.copy_seconds(shape)}
        if shape.num_restored_tokens or shape.num_captured_tokens:
            parts["hidden_states"] = self.hidden_state_seconds(shape)
        graph = piecewise = False
        if shape.num_reqs:
            pad = self.graph_batch(shape)
            graph = pad is not None
            piece = None if graph else self.piecewise_size(shape)
            piecewise = piece is not None
            if pad is not None:
                parts.update(self._graph(shape, pad))
            elif piece is not None and shape.num_prefix_rows:
                parts.update(self._piecewise_truncated(shape, piece))
            elif piece is not None:
                parts.update(self._piecewise(shape, piece))
            else:
                parts.update(self._eager(shape))
            if not graph and self.config.overlap_swap and (
                    shape.num_swap_in or shape.num_swap_out or shape.num_prefix_copy_blocks):
                _, parts["copies"] = self.swap_overlap(shape, parts["forward"])
            parts["sample"] = self.timer.keyed(_sample_op(self.shapes, shape.num_sampled),
                                               shape.num_sampled) if shape.num_sampled else 0.0
        if shape.items:  # memory systems' own work, at the prices they registered
            parts["items"] = sum(kind_named(k).price(self, n) for k, n in shape.items)
        loop = self.loop.seconds(shape.num_reqs, shape.num_sampled)
        return StepCost(sum(parts.values()), loop, graph, parts, piecewise)

    def background_seconds(self, shape: StepShape) -> float:
        """How long the step's background copies (the kinds' `background` hooks) keep the
        copy stream busy once the step is issued: what the next step waits for."""
        return sum(kind.background(self, n) for kind, n in
                   ((kind_named(k), n) for k, n in shape.items) if kind.background is not None)

    def hidden_state_seconds(self, shape: StepShape) -> float:
        """The hidden-state store's two costs, in the runner's order on one stream: restoring KV (hidden
        rows over PCIe, then per layer the K/V projection GEMM and its KV write) and sending
        every computed token's hidden states to the host (one copy per layer)."""
        m, hw, d = self.mc, self.hw, 2
        bulk_in = hw.h2d[CopyMechanism.BULK]
        bulk_out = hw.d2h[CopyMechanism.BULK]
        per_token_layer = m.hidden_size * d
        t = 0.0
        n = shape.num_restored_tokens
        if n:
            flops = 2.0 * n * m.hidden_size * 2 * m.kv_size * m.num_layers
            weights = m.num_layers * m.hidden_size * 2 * m.kv_size * d
            moved = n * (m.num_layers * per_token_layer + m.kv_bytes_per_token(d))
            t += bulk_in.seconds(n * m.num_layers * per_token_layer, m.num_layers)
            t += hw.roofline_s(flops, weights + moved) + 4 * m.num_layers * self.host.launch_s
        c = shape.num_captured_tokens
        if c:
            t += bulk_out.seconds(c * m.num_layers * per_token_layer, m.num_layers)
        return t

    def swap_overlap(self, shape: StepShape, forward_s: float) -> tuple[float, float]:
        """(forward with its waits for copies, the bubble) of an eager or piecewise step
        whose copies overlap a forward of `forward_s` seconds, layer group by layer group."""
        out, inn = self.copy_parts(shape)
        top = (self.prefix_copy_seconds(shape), shape.prefix_host_groups)
        return swap_overlap_seconds(forward_s, out, inn, self.group_layers(), top,
                                    self.config.prefix_copy_window)

    def prefix_copy_seconds(self, shape: StepShape) -> float:
        """Offloaded dropped prefixes: host -> device seconds of their block copies."""
        n = shape.num_prefix_copy_blocks
        if not n:
            return 0.0
        c = self.calib
        if c is not None and self.timer.same_hw and c.copy_in_blocks:
            return c.copy_in_blocks.at(n)
        return self.copy_costs()[1].seconds(self.config.block_bytes * n)

    def group_layers(self) -> list[int]:
        """Layers in each layer group (the last may hold fewer)."""
        L = self.mc.num_layers
        f = self.config.layers_per_block or L
        return [min(f, L - start) for start in range(0, L, f)]

    def graph_batch(self, shape: StepShape) -> int | None:
        """The padded batch whose graph the runner replays, or None for an eager step."""
        if not shape.is_decode_only or shape.num_sampled != shape.num_decodes:
            return None
        if shape.num_swap_in and self.config.overlap_swap and self.piece_sizes:
            return None  # the runner waits for swap-ins between pieces instead
        for size in self.graph_sizes:
            if size >= shape.num_decodes:
                return size
        return None

    def piecewise_size(self, shape: StepShape) -> int | None:
        """The padded token count whose pieces the runner replays for this step, or None: a
        decode graph replays instead, piecewise graphs are off, or the step has more tokens
        than the largest size (the runner falls back to eager)."""
        n = shape.num_tokens
        if not n or not self.piece_sizes or self.graph_batch(shape) is not None:
            return None
        return self.padded_piece(n, 0) or None

    def padded_piece(self, n: int, default: int) -> int:
        """The smallest piece size that holds n tokens, else `default`."""
        return next((t for t in self.piece_sizes if t >= n), default)

    # ---- the three paths -----------------------------------------------------------------------
    def _graph(self, shape: StepShape, pad: int) -> dict[str, float]:
        layer = self.layer_kernels(shape, pad, graph=True)
        head = self.head_kernels(pad, pad)
        h = self.host
        host = h.graph_s + h.graph_s_per_req * shape.num_reqs
        return {"host": host, "layers": self.shapes.num_layers * sum(layer), "head": sum(head),
                "attn_tail": h.graph_s_per_tail_token * self.attention_tail_tokens(shape)}

    def attention_tail_tokens(self, shape: StepShape) -> float:
        """Layers x tokens by which the longest decode context exceeds the mean (see
        `HostParams.graph_s_per_tail_token`)."""
        if not shape.num_decodes:
            return 0.0
        mean = shape.decode_ctx_sum / shape.num_decodes
        return self.shapes.num_layers * max(0.0, shape.decode_ctx_max - mean)

    def _eager(self, shape: StepShape) -> dict[str, float]:
        t = shape.num_tokens
        through = self.through_attention_kernels(shape, t, graph=False)
        layer = [*through, *self.after_attention_kernels(t)]
        head = self.head_kernels(t, shape.num_sampled)
        h = self.host
        host = h.eager_s + h.eager_s_per_req * shape.num_reqs + h.eager_s_per_token * t
        # The last layer past its attention runs over the rows with logits only.
        kept = self.kept_rows(shape)
        last = [*through, *(self.after_attention_kernels(kept) if kept else [])]
        fwd = forward_seconds(layer, self.shapes.num_layers - 1, h.launch_s,
                              pre_kernels=head[:1], post_kernels=[*last, *head[1:]])
        return {"host": host, "forward": fwd}

    def kept_rows(self, shape: StepShape) -> int:
        """Rows the last layer keeps past its attention outside a decode graph: the rows with
        logits, padded to a decode graph size as the runner pads them."""
        n = shape.num_sampled
        return next((size for size in self.graph_sizes if size >= n), n) if n else 0

    def _piecewise(self, shape: StepShape, t: int, keep_rows: bool = True
                   ) -> dict[str, float]:
        pre, layer, last, post = self.piecewise_launches(shape, t, keep_rows)
        h, n = self.host, shape.num_tokens
        host = h.eager_s + h.eager_s_per_req * shape.num_reqs + h.eager_s_per_token * n
        fwd = queue_seconds(layer, self.shapes.num_layers - 1, pre, [*last, *post])
        return {"host": host, "forward": fwd}

    def _piecewise_truncated(self, shape: StepShape, t: int) -> dict[str, float]:
        """A piecewise step whose prefix rows stop below the top `prefix_host_groups` layer
        groups: the layers below run the whole batch, those above it without the prefix
        rows (each side priced as a whole forward and taken pro rata by layers, the host
        terms from the whole batch)."""
        full = self._piecewise(shape, t, keep_rows=False)  # such a forward keeps every row
        short_shape = shape.without_prefix_rows()
        n = short_shape.num_tokens  # the runner's pieces above pad to n, graph or not
        short_t = self.padded_piece(n, t)
        short = self._piecewise(short_shape, short_t, keep_rows=False)
        L = self.shapes.num_layers
        upper = min(L, shape.prefix_host_groups * (self.config.layers_per_block or L))
        fwd = (full["forward"] * (L - upper) + short["forward"] * upper) / L
        return {"host": full["host"], "forward": fwd}

    def piecewise_launches(self, shape: StepShape, t: int, keep_rows: bool = True
                           ) -> tuple[list[Launch], list[Launch], list[Launch], list[Launch]]:
        """(before the layers, one layer, the last layer, after them) as (host s, device s)
        launches. Before: the embedding and input copies, piece 0 (layer 0 up to its
        attention). A layer: attention at the real rows, its output's copy, the next piece
        (the whole rest of this layer and the next layer up to attention, at t rows); the last
        layer's piece ends with its MLP, run (`keep_rows`) at the padded count of the rows
        with logits after gathering them. After: the final norm and lm_head, eager."""
        h, n = self.host, shape.num_tokens
        piece_in, piece_out = self.piece_kernels(t)
        attn: list[Launch] = [(h.attn_write_s, 0.0)]  # kv_write's time is in the attention's
        if shape.num_decodes:
            attn.append((h.attn_decode_s, self.timer.decode_attention(
                shape.num_decodes, shape.decode_ctx_sum, graph=False)))
        if shape.prefills:
            attn.append((h.attn_prefill_s, self.timer.prefill_attention(shape.prefills)))
        attn.append((h.op_launch_s, self.timer.keyed(attn_out_copy(self.shapes, n), n)))
        head = self.head_kernels(n, shape.num_sampled)  # [embedding + final norm, lm_head]
        pre = [(3 * h.op_launch_s, head[0]), (h.replay_s, piece_in)]
        replay = h.replay_s + h.piece_layer_s  # the layer's own host time goes with its replay
        layer = [*attn, (replay, piece_out + piece_in)]
        last = [*attn, (replay, piece_out)]
        if keep_rows:
            kept = self.kept_rows(shape)
            kept_t = self.padded_piece(kept, t)
            # an index_select and a copy for each of the attention output and the residual
            gather = self.timer.keyed(piece_copies(self.shapes, kept)[1], kept) if kept else 0.0
            last = [*attn, (4 * h.op_launch_s, gather), (replay, self.piece_kernels(kept_t)[1])]
        post = [(h.launch_s, 0.0), *((h.launch_s, g) for g in head[1:])]
        return pre, layer, last, post

    def piecewise_issue_seconds(self, shape: StepShape, t: int) -> float:
        """Host time to issue a piecewise forward (the launches' host costs alone)."""
        pre, layer, last, post = self.piecewise_launches(shape, t)
        L = self.shapes.num_layers
        return sum(c for c, _ in [*pre, *last, *post]) + (L - 1) * sum(c for c, _ in layer)

    def piece_kernels(self, t: int) -> tuple[float, float]:
        """Device seconds, at t padded rows, of (piece 0: a layer before attention: norm,
        qkv GEMM, rotary, copies into the buffers; the last piece: a layer after attention:
        o GEMM, norm, MLP, copies). A middle piece is their sum. Elementwise time is split
        2/4 before (norm, rotary) and 2/4 after (norm, silu*up)."""
        s, tm = self.shapes, self.timer
        ew = tm.keyed(layer_elementwise(s, t), t)
        dims = s.gemm_dims()
        g = {name: tm.keyed(gemm(name, t, *dims[name], s.elem), t) for name in _LAYER_GEMMS}
        cb, ca = piece_copies(s, t)
        ar = 2 * tm.allreduce(allreduce(s, t)) if s.tp > 1 else 0.0
        before = g["qkv"] + ew * 2 / ELEMENTWISE_KERNELS + tm.keyed(cb, t)
        after = (g["o"] + g["gate_up"] + g["down"] + ew * 2 / ELEMENTWISE_KERNELS
                 + tm.keyed(ca, t) + ar)
        return before, after

    def elementwise_kernel_seconds(self, rows: int) -> float:
        """One of a layer's elementwise kernels at `rows` rows (their measured time, spread
        evenly over the four)."""
        return self.timer.keyed(layer_elementwise(self.shapes, rows), rows) / ELEMENTWISE_KERNELS

    def after_attention_kernels(self, rows: int) -> list[float]:
        """The tail of `layer_kernels`: a layer's kernels after its attention, at `rows`
        rows (o GEMM, norm, gate_up GEMM, silu*up, down GEMM, all-reduces under TP)."""
        s, tm = self.shapes, self.timer
        ew = self.elementwise_kernel_seconds(rows)
        dims = s.gemm_dims()
        g = {n: tm.keyed(gemm(n, rows, *dims[n], s.elem), rows) for n in ("o", "gate_up", "down")}
        ar = [tm.allreduce(allreduce(s, rows))] if s.tp > 1 else []
        return [g["o"], *ar, ew, g["gate_up"], ew, g["down"], *ar]

    def layer_kernels(self, shape: StepShape, rows: int, graph: bool) -> list[float]:
        """Device seconds of one layer's kernels in issue order (elementwise time is spread
        over the four elementwise kernels between the GEMMs)."""
        return [*self.through_attention_kernels(shape, rows, graph),
                *self.after_attention_kernels(rows)]

    def through_attention_kernels(self, shape: StepShape, rows: int, graph: bool
                                  ) -> list[float]:
        """The head of `layer_kernels`: norm, qkv GEMM, rotary, then the attention's kernels
        (one entry per kernel launched: the queue counts launches)."""
        s, tm = self.shapes, self.timer
        ew = self.elementwise_kernel_seconds(rows)
        qkv = tm.keyed(gemm("qkv", rows, *s.gemm_dims()["qkv"], s.elem), rows)
        attn: list[float] = []
        if shape.num_decodes:
            t = tm.decode_attention(shape.num_decodes, shape.decode_ctx_sum, graph)
            attn += [t / DECODE_LAUNCHES] * DECODE_LAUNCHES
        if shape.prefills:
            attn += [tm.prefill_attention(shape.prefills) / PREFILL_LAUNCHES] * PREFILL_LAUNCHES
        return [ew, qkv, ew, *attn]

    def head_kernels(self, tokens: int, logit_rows: int) -> list[float]:
        """[embedding + final norm, lm_head] device seconds (sampling is timed apart)."""
        s, tm = self.shapes, self.timer
        ops = head_ops(s, tokens, logit_rows)
        out = [tm.head_elementwise(tokens, ops[:2])]
        if logit_rows:
            out.append(tm.keyed(ops[2], logit_rows))
        if s.tp > 1:  # vocab-parallel: the embedding's all-reduce, the logits' gather
            out[0] += tm.allreduce(allreduce(s, tokens))
            if logit_rows:
                out[1] += tm.allgather(logits_gather(s, logit_rows))
        return out

    def copy_seconds(self, shape: StepShape) -> float:
        """Swap-outs then swap-ins, one call each way (the runner's `copy_blocks`), and the
        copies of offloaded dropped prefixes."""
        return sum(self.copy_parts(shape)) + self.prefix_copy_seconds(shape)

    def copy_parts(self, shape: StepShape) -> tuple[float, float]:
        """(swap-out seconds, swap-in seconds) of the step's copies."""
        c = self.calib
        if c is not None and self.timer.same_hw and c.copy_out_blocks and c.copy_in_blocks:
            return ((c.copy_out_blocks.at(shape.num_swap_out) if shape.num_swap_out else 0.0),
                    (c.copy_in_blocks.at(shape.num_swap_in) if shape.num_swap_in else 0.0))
        out, inn = self.copy_costs()
        b = self.config.block_bytes
        return ((out.seconds(b * shape.num_swap_out) if shape.num_swap_out else 0.0),
                (inn.seconds(b * shape.num_swap_in) if shape.num_swap_in else 0.0))

    def copy_costs(self) -> tuple[CopyCost, CopyCost]:
        """The runner's swap path, affine: measured, or (uncalibrated) one bulk copy each way."""
        if self.calib is not None and self.timer.same_hw:
            return self.calib.copy_out, self.calib.copy_in
        return self.hw.d2h[CopyMechanism.BULK], self.hw.h2d[CopyMechanism.BULK]


def _sample_op(s: Shapes, rows: int):
    return head_ops(s, 0, rows)[3]


def _check_calibration(mc: ModelConfig, calib: Calibration) -> None:
    dims = model_dims(mc)
    if calib.model_dims != dims:
        raise ValueError(f"calibration of {calib.model} {calib.model_dims} does not match "
                         f"{mc.name} {dims}")
