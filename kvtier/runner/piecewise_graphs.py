"""Piecewise CUDA graphs for steps that carry prefill rows (mixed, prefill, dropped-prefix recompute).

Such a step's attention has varlen metadata, so the whole forward cannot be one graph; but
everything else in a layer can. Everything between two attentions — layer l-1 after
its attention (o GEMM, norm, MLP) and layer l before its own (norm, qkv GEMM, q/k norm;
rotary too unless the attention backend fuses it into its KV write) — is one piece,
captured at padded token counts and replayed around an eager attention call: per layer one graph launch and the attention kernels, instead of ~15
launches each paying Python's launch cost (and cuBLAS's per-shape heuristics at a token
count not seen before). Eager mixed steps of the offline ShareGPT run are host-bound, the
host issuing slower than the kernels run (results/offline/
offline_sharegpt_h200_eager_mixed.json and profile_offline_eager_h200.json); with the pieces
they are GPU-bound (benchmarks/offline/profile_offline_steps.py). On by default; `--no-piecewise-
graphs` runs such steps eagerly.

Activations flow through static buffers shared by all layers (layers run one after the
other): `hidden` and `residual` between pieces, `q`/`k`/`v` into attention, `attn_out` out
of it. Rows past the step's token count are padding: they never reach the KV cache (attention
gets the first `num_tokens` rows) and no row depends on another outside attention. With
`capture=False` the same pieces run eagerly through the same buffers (the CPU test path).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from kvtier.attention.metadata import AttentionMetadata
from kvtier.core.graph_sizes import piecewise_sizes
from kvtier.model.llama import DecoderLayer, ForwardContext
from kvtier.runner.capture_guard import collector_paused
from kvtier.runner.graph_host import GraphHost


class PiecewiseGraphs:
    def __init__(self, runner: GraphHost, capture: bool = True,
                 keep_attention_inputs: bool = False):
        self.runner: GraphHost = weakref.proxy(runner)
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
        # A hidden-state store: each piece also leaves its layer's attention input (the normed hidden
        # state) here, and the step hands it to the hidden-state sink before the next piece
        # overwrites it (stream order).
        self.attn_in = (torch.zeros(m, cfg.hidden_size, dtype=dt, device=dev)
                        if keep_attention_inputs else None)
        self.capture_graphs = capture
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (piece, size)
        self.pool: Any = None

    def _ctx(self) -> ForwardContext:
        r = self.runner
        assert r.gpu_kv is not None
        # Pieces touch neither attention nor its metadata: placeholders for the context.
        keep = self._keep_attention_input if self.attn_in is not None else None
        return ForwardContext(r.ops, r.attention, r.gpu_kv, None, r.cos_sin,  # type: ignore[arg-type]
                              keep)

    def _keep_attention_input(self, layer_idx: int, x: torch.Tensor) -> None:
        assert self.attn_in is not None
        self.attn_in[: x.shape[0]].copy_(x)

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

    def _piece(self, k: int, t: int, ctx: ForwardContext) -> None:
        """Piece k: layer k-1 after its attention, then layer k up to its attention (the
        first piece has no layer before it, the last none after); L + 1 pieces in all."""
        layers = self.runner.model.layers
        if k > 0:
            prev = layers[k - 1]
            assert isinstance(prev, DecoderLayer)
            self._after(prev, t, ctx)
        if k < len(layers):
            layer = layers[k]
            assert isinstance(layer, DecoderLayer)
            self._before(layer, k == 0, t, ctx)

    @torch.inference_mode()
    def capture(self) -> None:
        if not self.capture_graphs:
            return
        ctx = self._ctx()
        num_layers = len(self.runner.model.layers)
        with collector_paused():  # no destructor of dead CUDA objects inside a capture
            for t in reversed(self.sizes):
                for k in range(num_layers + 1):
                    self._piece(k, t, ctx)  # warm-up: Triton compiles here
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool):
                        self._piece(k, t, ctx)
                    if self.pool is None:
                        self.pool = graph.pool()
                    self.graphs[(k, t)] = graph
            torch.cuda.synchronize()

    def padded(self, num_tokens: int) -> int | None:
        return next((s for s in self.sizes if s >= num_tokens), None)

    # ---- a step --------------------------------------------------------------------------
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                meta: AttentionMetadata,
                kv_wait: Callable[[int], None] | None = None,
                hidden_sink: Callable[[int, torch.Tensor], None] | None = None,
                truncate: tuple[int, AttentionMetadata] | None = None,
                kv_after: Callable[[int], None] | None = None,
                keep: torch.Tensor | None = None,
                ) -> torch.Tensor | None:
        """Final hidden states [num_tokens, hidden] (only the rows `keep` asks for, where
        given: after the last attention the rest stop, as in `LlamaForCausalLM.forward`,
        and the last piece runs at their padded count), or None if the step is too large.
        `kv_wait(l)` runs before layer l's attention: between pieces is the one place a
        step can wait for the swap-ins of a layer group (layer-level overlap) while the
        earlier layers' pieces already run. `hidden_sink(l, x)` receives layer l's attention
        input (hidden-state store). `truncate=(L, meta')`: from layer L on, only meta'.num_tokens rows
        go on, with meta' (offloaded dropped prefixes: their rows, last in the batch, are
        recomputed through the first L layers only; rows are independent outside attention,
        so the later pieces simply run at the smaller padded size). `kv_after(l)` runs once
        layer l's attention is issued (copies waiting for that layer's scratch to be read)."""
        n = input_ids.shape[0]
        t = self.padded(n)
        if t is None:
            return None
        r = self.runner
        model = r.model
        ctx = self._ctx()
        self.hidden[:n] = model.embed_tokens(input_ids)
        self.positions[:n].copy_(positions)
        self.positions[n:t].zero_()
        self._run(0, t, ctx)
        q, k, v, out = self.q[:n], self.k[:n], self.v[:n], self.attn_out[:n]
        rope = ctx.rope(self.positions[:n])
        attention, kv = r.attention, r.gpu_kv
        assert kv is not None
        for layer_idx, layer in enumerate(model.layers):
            assert isinstance(layer, DecoderLayer)
            if truncate is not None and layer_idx == truncate[0]:
                meta = truncate[1]
                n = meta.num_tokens
                t = self.padded(n) or t
                q, k, v, out = self.q[:n], self.k[:n], self.v[:n], self.attn_out[:n]
                rope = ctx.rope(self.positions[:n])
            if hidden_sink is not None:
                assert self.attn_in is not None, "pieces built without keep_attention_inputs"
                hidden_sink(layer_idx, self.attn_in[:n])
            if kv_wait is not None:
                kv_wait(layer_idx)
            # straight into the next piece's input buffer: no output tensor, no copy launch
            attention.forward(layer_idx, q, k, v, kv, meta, layer.attn.scale, out=out,
                              rope=rope)
            if kv_after is not None:
                kv_after(layer_idx)
            if keep is not None and layer_idx == len(model.layers) - 1:
                n, t = self._keep_rows(keep, n)
            self._run(layer_idx + 1, t, ctx)
        x, _ = r.ops.fused_add_rms_norm(self.hidden[:n], self.residual[:n], model.final_norm,
                                        model.cfg.rms_norm_eps)
        return x

    def _keep_rows(self, keep: torch.Tensor, n: int) -> tuple[int, int]:
        """Moves the attention output and residual of rows `keep` (of the first n) to the
        front of their buffers; returns their count and the padded size to run at."""
        m = keep.shape[0]
        for buf in (self.attn_out, self.residual):
            buf[:m].copy_(buf[:n].index_select(0, keep))  # gathered first: rows may overlap
        t = self.padded(m)
        assert t is not None
        return m, t

    def _run(self, k: int, t: int, ctx: ForwardContext) -> None:
        graph = self.graphs.get((k, t))
        if graph is not None:
            graph.replay()
        else:
            self._piece(k, t, ctx)
