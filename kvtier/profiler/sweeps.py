"""Operator sweeps on a real runner: each operator is called once per layer (each layer's own
weights and KV slots, as the forward pass does, so nothing is served from L2 that a real
forward would not) inside one CUDA graph, and the time is divided by the layer count."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from kvtier.attention.base import Rope
from kvtier.profiler.plans import GREEDY, PlanBuilder, finish_plan
from kvtier.profiler.timing import DeviceTimer
from kvtier.runner.sampler import SampleRow, sample

Log = Callable[[str], None]


class OpSweeper:
    """Each timed callable drops every output before the next call: inside a CUDA graph
    capture, outputs kept alive would each take their own memory (40 layers x a 8192-token
    MLP output is gigabytes, beyond what the KV pool leaves free)."""

    def __init__(self, runner, timer: DeviceTimer, log: Log = print):
        self.runner, self.timer, self.log = runner, timer, log
        self.model = runner.model
        self.mc = runner.model_config
        self.L = self.mc.num_layers
        self.dev, self.dtype = runner.device, runner.dtype
        assert runner.gpu_kv is not None, "allocate the KV pools first"
        self.builder = PlanBuilder(runner.num_groups, runner.block_size,
                                   runner.gpu_kv.shape[0] - (1 if runner.graphs else 0),
                                   self.mc.vocab_size)

    def _randn(self, *shape: int) -> torch.Tensor:
        return torch.randn(*shape, dtype=self.dtype, device=self.dev)

    # ---- GEMMs ---------------------------------------------------------------------------------
    def gemms(self, rows: list[int]) -> dict[str, list[list[float]]]:
        layers = self.model.layers
        weights = {
            "qkv": [(ly.attn.qkv_weight, ly.attn.qkv_bias) for ly in layers],
            "o": [(ly.attn.o_weight, None) for ly in layers],
            "gate_up": [(ly.mlp.gate_up_weight, None) for ly in layers],
            "down": [(ly.mlp.down_weight, None) for ly in layers],
        }
        head = self.model.embed if self.model.lm_head is None else self.model.lm_head
        out: dict[str, list[list[float]]] = {}
        for name, ws in weights.items():
            out[name] = [[m, self._gemm(ws, m)] for m in rows]
            self.log(f"  gemm {name}: " + ", ".join(f"{m}:{t * 1e6:.0f}us" for m, t in out[name]))
        out["lm_head"] = [[m, self._gemm([(head, None)] * 4, m)] for m in rows if m <= 1024]
        return out

    def _gemm(self, ws: list, m: int) -> float:
        x = self._randn(m, ws[0][0].shape[1])

        def run() -> None:
            for w, b in ws:
                F.linear(x, w, b)

        return self.timer.graph_seconds(run) / len(ws)

    # ---- elementwise ---------------------------------------------------------------------------
    def elementwise(self, tokens: list[int]) -> list[list[float]]:
        """A layer's two fused add+norms, rotary and silu*up (kv_write goes with attention, and
        rotary too where the backend fuses it into its KV write, as the engine runs them)."""
        res = [[t, self._elementwise_at(t)] for t in tokens]
        self.log("  elementwise/layer: " + ", ".join(f"{t}:{s * 1e6:.1f}us" for t, s in res))
        return res

    def _elementwise_at(self, t: int) -> float:
        mc, ops = self.mc, self.runner.ops
        x, r = self._randn(t, mc.hidden_size), self._randn(t, mc.hidden_size)
        qkv = self._randn(t, mc.q_size + 2 * mc.kv_size)
        gu = self._randn(t, 2 * mc.intermediate_size)
        pos = torch.randint(0, self.runner.cos_sin.shape[0], (t,), device=self.dev)
        norms = [(ly.input_norm, ly.post_attn_norm) for ly in self.model.layers]
        fused_rotary = self.runner.attention.fuses_rotary

        def layer(w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
            ops.fused_add_rms_norm(x, r, w1, mc.rms_norm_eps)
            q, k, _ = qkv.split([mc.q_size, mc.kv_size, mc.kv_size], dim=-1)
            if not fused_rotary:
                ops.rotary(q.view(t, mc.num_heads, mc.head_dim),
                           k.view(t, mc.num_kv_heads, mc.head_dim), pos, self.runner.cos_sin)
            ops.fused_add_rms_norm(x, r, w2, mc.rms_norm_eps)
            return ops.silu_and_mul(gu)

        def run() -> None:
            for a, b in norms:
                layer(a, b)

        return self.timer.graph_seconds(run) / self.L

    def head_elementwise(self, tokens: list[int]) -> list[list[float]]:
        """Embedding gather + final norm."""
        return [[t, self._head_at(t)] for t in tokens]

    def _head_at(self, t: int) -> float:
        mc, ops, model = self.mc, self.runner.ops, self.model
        ids = torch.randint(0, mc.vocab_size, (t,), device=self.dev)
        r = self._randn(t, mc.hidden_size)

        def head():
            x = F.embedding(ids, model.embed)
            return ops.fused_add_rms_norm(x, r, model.final_norm, mc.rms_norm_eps)

        return self.timer.graph_seconds(head)

    def sample(self, rows: list[int]) -> list[list[float]]:
        """The sampler on bf16 logits: greedy argmax, the host sync, row objects."""
        res = [[s, self._sample_at(s)] for s in rows]
        self.log("  sample: " + ", ".join(f"{s}:{t * 1e6:.0f}us" for s, t in res))
        return res

    def _sample_at(self, s: int) -> float:
        logits = self._randn(s, self.mc.vocab_size)
        sample_rows = [SampleRow(GREEDY, 1, ())] * s
        return self.timer.wall_seconds(lambda: sample(logits, sample_rows))

    # ---- host launch costs (piecewise steps) ------------------------------------------------------
    def host_launches(self, decode_ctx: int = 128, decode_rows: int = 4,
                      prefill: tuple[int, int] = (64, 0)) -> dict[str, float]:
        """Host seconds to issue (not to run) what a piecewise step launches per layer: the
        attention backend's call over decode rows, over prefill rows and over both (the fit
        solves its kv_write, decode and prefill wrappers from the three), one torch copy, and
        one piece's graph replay (when the runner captured pieces)."""
        out: dict[str, float] = {}
        dec = [decode_ctx] * decode_rows
        for name, (c, p) in (("decode", (dec, [])), ("prefill", ([], [prefill])),
                             ("mixed", (dec, [prefill]))):
            sec = self._attention_issue(c, p)
            if sec is not None:
                out[f"attn_{name}_s"] = sec
        x, y = self._randn(256, self.mc.hidden_size), self._randn(256, self.mc.hidden_size)
        out["op_s"] = self._issue(lambda: [x.copy_(y) for _ in range(self.L)]) / self.L
        pw = self.runner.piecewise
        if pw is not None and pw.graphs:
            t = pw.sizes[0]
            graphs = [pw.graphs[(k, t)] for k in range(self.L + 1) if (k, t) in pw.graphs]
            out["replay_s"] = self._issue(lambda: [g.replay() for g in graphs]) / len(graphs)
        self.log("  host launches: " + ", ".join(f"{k} {v * 1e6:.1f}us" for k, v in out.items()))
        return out

    def _issue(self, fn: Callable[[], object]) -> float:
        """Median host seconds of `fn()` without waiting for the device (synced between)."""
        fn()  # warm-up: compiles, allocator
        self.timer.sync()
        times = []
        for _ in range(max(self.timer.reps, 5)):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            self.timer.sync()
        return statistics.median(times)

    def _attention_issue(self, contexts: list[int], prefills: list[tuple[int, int]]) -> float | None:
        """Per-layer host seconds of the attention backend's call (eager splits, as a
        piecewise step calls it), or None if the KV does not fit the pool."""
        return self._time_attention(contexts, prefills, graph_splits=False, issue_only=True)

    # ---- attention -------------------------------------------------------------------------------
    def attention(self, contexts: list[int], prefills: list[tuple[int, int]],
                  graph_splits: bool) -> float | None:
        """Per-layer seconds of kv_write (with rotary, where fused) + attention for these
        decode contexts and prefill chunks, or None if their KV does not fit the pool."""
        return self._time_attention(contexts, prefills, graph_splits, issue_only=False)

    def _time_attention(self, contexts: list[int], prefills: list[tuple[int, int]],
                        graph_splits: bool, issue_only: bool) -> float | None:
        """Install the rows, time every layer's attention call (host issue time, or device
        time through a graph), remove the rows again."""
        b, mc, runner = self.builder, self.mc, self.runner
        b.reset()
        if not b.fits(list(contexts) + [n + s for n, s in prefills]):
            return None
        install, _ = b.decode_rows(contexts)
        rows = install + b.prefill_rows(prefills)
        try:
            batch = runner.prepare_batch(rows)
            _, _, meta = runner.device_inputs(batch)
            if graph_splits:  # graphs pass max_model_len: splits fixed for every batch
                meta = dataclasses.replace(meta, max_seq_len=runner.config.scheduler.max_model_len)
            t = batch.num_tokens
            q = self._randn(t, mc.num_heads, mc.head_dim)
            k = self._randn(t, mc.num_kv_heads, mc.head_dim)
            v = self._randn(t, mc.num_kv_heads, mc.head_dim)
            attn, kv, scale = runner.attention, runner.gpu_kv, mc.head_dim ** -0.5
            rope = None  # the model leaves rotary to a backend that fuses it: timed here
            if attn.fuses_rotary:
                pos = torch.randint(0, runner.cos_sin.shape[0], (t,), device=self.dev)
                rope = Rope(pos, runner.cos_sin)

            def run() -> None:
                for i in range(self.L):
                    attn.forward(i, q, k, v, kv, meta, scale, rope=rope)

            seconds = self._issue(run) if issue_only else self.timer.graph_seconds(run)
            return seconds / self.L
        finally:
            runner.execute(finish_plan(rows))

    def decode_grid(self, batches: list[int], contexts: list[int], graph_splits: bool) -> list[list[float]]:
        res = []
        for c in contexts:
            for bsz in batches:
                sec = self.attention([c] * bsz, [], graph_splits)
                if sec is not None:
                    res.append([bsz, c, sec])
        tag = "graph" if graph_splits else "eager"
        self.log(f"  decode attention ({tag}): " + ", ".join(
            f"{int(b)}x{int(c)}:{s * 1e6:.0f}us" for b, c, s in res))
        return res

    def prefill_cases(self, cases: list[list[tuple[int, int]]]) -> list[list]:
        """Rows [[[new, start], ...], seconds]."""
        res: list[tuple[list[tuple[int, int]], float]] = []
        for pre in cases:
            sec = self.attention([], pre, graph_splits=False)
            if sec is not None:
                res.append((pre, sec))
        self.log("  prefill attention: " + ", ".join(
            f"{'+'.join(str(n) for n, _ in p)}:{s * 1e6:.0f}us" for p, s in res))
        return [[[list(c) for c in p], s] for p, s in res]
