"""Piecewise CUDA graphs for steps that carry prefill rows (mixed, prefill, eLLM recompute).

Such a step's attention has varlen metadata, so the whole forward cannot be one graph; but
everything else in a layer can. Each layer's two pieces — before attention (norm, qkv GEMM,
q/k norm, rotary) and after it (o GEMM, norm, MLP) — are captured at padded token counts and
replayed around an eager attention call: per layer two graph launches and the attention
kernels, instead of ~15 launches each paying Python's launch cost. Measured on the H200,
eager mixed steps were host-launch-bound (~40 ms for ~20 ms of GPU work,
benchmarks/results/offline_sharegpt_h200.json); this is the fix, opt-in
(`--piecewise-graphs`) until it is measured there.

Activations flow through static buffers shared by all layers (layers run one after the
other): `hidden` and `residual` between pieces, `q`/`k`/`v` into attention, `attn_out` out
of it. Rows past the step's token count are padding: they never reach the KV cache (attention
gets the first `num_tokens` rows) and no row depends on another outside attention. With
`capture=False` the same pieces run eagerly through the same buffers (the CPU test path).
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from kvtier.attention.metadata import AttentionMetadata
from kvtier.model.llama import DecoderLayer, ForwardContext

if TYPE_CHECKING:
    from kvtier.runner.model_runner import ModelRunner


def piecewise_sizes(max_tokens: int) -> list[int]:
    sizes, t = [], 64
    while t < max_tokens:
        sizes.append(t)
        t *= 2
    return [*sizes, max_tokens]


class PiecewiseGraphs:
    def __init__(self, runner: ModelRunner, capture: bool = True):
        self.runner: ModelRunner = weakref.proxy(runner)
        cfg, dev, dt = runner.model_config, runner.device, runner.dtype
        self.sizes = piecewise_sizes(runner.config.scheduler.max_num_batched_tokens)
        m = self.sizes[-1]
        self.positions = torch.zeros(m, dtype=torch.int64, device=dev)
        self.hidden = torch.zeros(m, cfg.hidden_size, dtype=dt, device=dev)
        self.residual = torch.zeros(m, cfg.hidden_size, dtype=dt, device=dev)
        self.q = torch.zeros(m, cfg.num_heads, cfg.head_dim, dtype=dt, device=dev)
        self.k = torch.zeros(m, cfg.num_kv_heads, cfg.head_dim, dtype=dt, device=dev)
        self.v = torch.zeros(m, cfg.num_kv_heads, cfg.head_dim, dtype=dt, device=dev)
        self.attn_out = torch.zeros(m, cfg.num_heads, cfg.head_dim, dtype=dt, device=dev)
        self.capture_graphs = capture
        self.graphs: dict[tuple[int, int, str], torch.cuda.CUDAGraph] = {}
        self.pool: Any = None

    def _ctx(self) -> ForwardContext:
        r = self.runner
        assert r.gpu_kv is not None
        # Pieces touch neither attention nor its metadata: placeholders for the context.
        return ForwardContext(r.ops, r.attention, r.gpu_kv, None, r.cos_sin)  # type: ignore[arg-type]

    # ---- the two pieces, reading and writing the static buffers ------------------------
    def _before(self, layer: DecoderLayer, first: bool, t: int, ctx: ForwardContext) -> None:
        residual = None if first else self.residual[:t]
        q, k, v, res = layer.before_attention(self.hidden[:t], residual, self.positions[:t], ctx)
        self.q[:t].copy_(q)
        self.k[:t].copy_(k)
        self.v[:t].copy_(v)
        self.residual[:t].copy_(res)

    def _after(self, layer: DecoderLayer, t: int, ctx: ForwardContext) -> None:
        x, res = layer.after_attention(self.attn_out[:t], self.residual[:t], ctx.ops)
        self.hidden[:t].copy_(x)
        self.residual[:t].copy_(res)

    def _piece(self, layer_idx: int, t: int, which: str, ctx: ForwardContext) -> None:
        layer = self.runner.model.layers[layer_idx]
        assert isinstance(layer, DecoderLayer)
        if which == "before":
            self._before(layer, layer_idx == 0, t, ctx)
        else:
            self._after(layer, t, ctx)

    @torch.inference_mode()
    def capture(self) -> None:
        if not self.capture_graphs:
            return
        ctx = self._ctx()
        num_layers = len(self.runner.model.layers)
        for t in reversed(self.sizes):
            for layer_idx in range(num_layers):
                for which in ("before", "after"):
                    self._piece(layer_idx, t, which, ctx)  # warm-up: Triton compiles here
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool):
                        self._piece(layer_idx, t, which, ctx)
                    if self.pool is None:
                        self.pool = graph.pool()
                    self.graphs[(layer_idx, t, which)] = graph
        torch.cuda.synchronize()

    def padded(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    # ---- a step --------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor | None:
        """Final hidden states [num_tokens, hidden], or None if the step is too large."""
        n = input_ids.shape[0]
        t = self.padded(n)
        if t is None:
            return None
        r = self.runner
        model = r.model
        ctx = self._ctx()
        self.hidden[:n] = F.embedding(input_ids, model.embed)
        self.positions[:n].copy_(positions)
        self.positions[n:t].zero_()
        for layer_idx, layer in enumerate(model.layers):
            assert isinstance(layer, DecoderLayer)
            self._run(layer_idx, t, "before", ctx)
            out = r.attention.forward(layer_idx, self.q[:n], self.k[:n], self.v[:n], r.gpu_kv,
                                      meta, layer.attn.scale)
            self.attn_out[:n].copy_(out)
            self._run(layer_idx, t, "after", ctx)
        x, _ = r.ops.fused_add_rms_norm(self.hidden[:n], self.residual[:n], model.final_norm,
                                        model.cfg.rms_norm_eps)
        return x

    def _run(self, layer_idx: int, t: int, which: str, ctx: ForwardContext) -> None:
        graph = self.graphs.get((layer_idx, t, which))
        if graph is not None:
            graph.replay()
        else:
            self._piece(layer_idx, t, which, ctx)
