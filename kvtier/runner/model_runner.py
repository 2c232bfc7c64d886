"""The model runner: the one place that owns tensors (weights, KV pools, batch inputs).

Executes a StepPlan: block copies between pools, then one forward pass over all scheduled
tokens (a CUDA-graph replay for decode-only steps), then sampling for the requests that
reached the end of their known tokens. With `overlap_swap` (the default) the copies run on
their own stream and the forward waits for each layer group's swap-ins only before that
group's first attention (kvtier/runner/swap_copies.py), so a decode step that brings
requests back replays the piecewise graphs rather than the full-model one: a full graph
could only wait for every copy before it starts.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING

import numpy as np
import torch

from kvtier.attention.base import ExternalRows
from kvtier.attention.metadata import AttentionMetadata
from kvtier.config import EngineConfig
from kvtier.core.graph_sizes import graph_batch_sizes
from kvtier.core.items import by_kind, group_of
from kvtier.core.plan import (
    BlockCopy,
    HiddenBlocks,
    HiddenRestore,
    RecomputePrefix,
    ScheduledRequest,
    StepPlan,
    StepResult,
)
from kvtier.kv.manager import cdiv
from kvtier.model.llama import DecoderLayer, ForwardContext
from kvtier.model.loader import build_model
from kvtier.model.rope import cos_sin_cache
from kvtier.runner import sampler
from kvtier.runner.async_tokens import DeviceTokens, PendingStep
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.cuda_graphs import DecodeGraphs
from kvtier.runner.device import make_attention_backend, make_ops
from kvtier.runner.external_rows import ExternalAttentionSource
from kvtier.runner.host_batch import HostBatch, build_host_batch, pad_rows
from kvtier.runner.kernel_warmup import warm_up_attention
from kvtier.runner.layer_inputs import LayerInputStore
from kvtier.runner.penalty_counts import PenaltyCounts
from kvtier.runner.piecewise_graphs import PiecewiseGraphs
from kvtier.runner.plan_items import run_items
from kvtier.runner.prefix_rows import copy_window, prefix_truncation, window_prefix_copies
from kvtier.runner.prompt_logprobs import PromptLogprobs, forward_scored
from kvtier.runner.staging import PinnedStaging
from kvtier.runner.startup import profile_activation_peak, warm_up_steps
from kvtier.runner.swap_copies import SwapCopies, make_streams

if TYPE_CHECKING:
    from kvtier.distributed.rank import TPRank

_sample_flag, _request_id = attrgetter("sample"), attrgetter("request_id")


class ModelRunner:
    def __init__(self, config: EngineConfig, ckpt, device: torch.device, dtype: torch.dtype,
                 tp: TPRank | None = None):
        """`tp`: this runner is one tensor-parallel rank (kvtier/distributed/): its model
        config and model are its shard's, its pools hold its KV heads."""
        self.config, self.device, self.dtype = config, device, dtype
        self.tp = tp
        mc = config.model_config
        if tp is None:
            self.model_config = mc
            self.model = build_model(mc, ckpt, dtype, device, config.seed)
            self.ops = make_ops(config.attention_backend, device)
        else:
            self.model_config, self.model = tp.build_model(mc, ckpt, dtype, device, config.seed)
            self.ops = tp.wrap_ops(make_ops(config.attention_backend, device))
        self.attention = make_attention_backend(config.attention_backend, device)
        self.cos_sin = cos_sin_cache(mc, config.scheduler.max_model_len, device)
        cache = config.cache
        self.block_size = cache.block_size
        self.layers_per_block = cache.layers_in_block(mc.num_layers)
        self.num_groups = cache.num_layer_groups(mc.num_layers)
        self.block_tables = BlockTables(
            self.num_groups, config.scheduler.max_num_seqs,
            cdiv(config.scheduler.max_model_len, self.block_size),
            device=device,
        )
        self.gpu_kv: torch.Tensor | None = None
        self.host_kv: torch.Tensor | None = None
        self.graphs: DecodeGraphs | None = None
        self.recompute_scratch = range(0)
        # Dropped prefixes keep this many top layer groups' KV in the host pool, copied in
        # each step, at most `prefix_copy_window` groups at once (0: all); set by the memory
        # system that drops prefixes (its prepare_executor hook), 0 otherwise.
        self.prefix_host_groups = 0
        self.prefix_copy_window = 0
        self.hidden: LayerInputStore | None = None  # Placement.HIDDEN's (attach_layer_inputs)
        self.piecewise: PiecewiseGraphs | None = None  # steps with prefill rows
        self.external: ExternalAttentionSource | None = None  # attach_external_attention
        self.copies = SwapCopies(make_streams(device, config.overlap_swap), self.num_groups,
                                 self.layers_per_block)
        self.async_tokens = DeviceTokens(config.scheduler.max_num_seqs, device)
        self.staging = PinnedStaging(device)
        self._placeholders: tuple[np.ndarray, np.ndarray] | None = None
        self.penalties = PenaltyCounts()  # penalized requests' token counts, on the device
        # One C-level call a sampling row (this runs for every one every step).
        self._sample_row = functools.partial(sampler.sample_row, self.model_config.eos_token_ids)

    @property
    def async_by_default(self) -> bool:
        """Async scheduling when the config leaves it open: on a GPU, where the device runs
        the step while the host prepares the next (vLLM's default too since its PR #27614);
        on the CPU the host is the device, so there is nothing to hide behind."""
        return self.device.type == "cuda"

    @property
    def supports_async(self) -> bool:
        """`launch` returns before the step's tokens are on the host (see PendingStep)."""
        return True

    @property
    def graphs_allowed(self) -> bool:
        """CUDA graphs of any kind (full decode graphs or pieces) may be captured."""
        return (self.device.type == "cuda" and not self.config.enforce_eager
                and self.attention.name == "triton")

    @functools.cached_property
    def graph_sizes(self) -> list[int]:
        """The padded decode batch sizes that have a graph (and the LM head's padded rows);
        fixed by the config, read by every step with prefill rows."""
        return graph_batch_sizes(self.config.scheduler.max_num_seqs,
                                 self.config.max_graph_batch_size)

    @property
    def use_cuda_graphs(self) -> bool:
        """Full-model decode graphs. A layer-input store keeps every layer's attention input,
        which a piecewise step hands over between its pieces but a whole-model graph cannot."""
        return self.graphs_allowed and self.hidden is None

    def attach_layer_inputs(self, store: LayerInputStore) -> None:
        """A store of every layer's attention input, set by the memory system that keeps
        hidden states (before allocate_kv: the graphs it captures depend on it)."""
        self.hidden = store

    def attach_external_attention(self, source: ExternalAttentionSource) -> None:
        """Rows whose attention a memory system computes (kvtier/runner/external_rows.py)."""
        self.external = source

    # ---- memory ------------------------------------------------------------------------
    def block_shape(self) -> tuple[int, ...]:
        mc = self.model_config
        return (self.layers_per_block, 2, self.block_size, mc.num_kv_heads, mc.head_dim)

    def allocate_kv(self, num_gpu_blocks: int, num_host_blocks: int,
                    num_recompute_blocks: int = 0) -> None:
        """Device pool, then blocks the KV manager never hands out: `num_recompute_blocks`
        of scratch for dropped-prefix recomputation and one for padded graph rows.
        Zeroed on the device: padded rows may read a block nobody wrote."""
        shape = self.block_shape()
        extra = 1 if self.graphs_allowed else 0
        self.recompute_scratch = range(num_gpu_blocks, num_gpu_blocks + num_recompute_blocks)
        total = num_gpu_blocks + num_recompute_blocks + extra
        self.gpu_kv = torch.zeros((total, *shape), dtype=self.dtype, device=self.device)
        pin = self.device.type == "cuda"
        self.host_kv = torch.empty((num_host_blocks, *shape), dtype=self.dtype, pin_memory=pin)
        if self.use_cuda_graphs:
            self.graphs = DecodeGraphs(self, scratch_block=total - 1)
            self.graphs.capture()
        if extra:
            layer = self.model.layers[0]
            assert isinstance(layer, DecoderLayer)
            warm_up_attention(self.gpu_kv[:, 0], total - 1, self.model_config.num_heads,
                              layer.attn.scale)
            # Greedy steps' argmax, compiled for this vocabulary before the first step.
            self.ops.argmax_rows(torch.zeros(2, self.model_config.vocab_size, dtype=self.dtype,
                                             device=self.device))
        if self.config.piecewise_graphs:
            self.piecewise = PiecewiseGraphs(self, capture=self.graphs_allowed,
                                             keep_attention_inputs=self.hidden is not None)
            self.piecewise.capture()

    def profile_activation_peak(self) -> int:
        """Peak activation bytes of the largest step (GPU only; kvtier/runner/startup.py)."""
        return profile_activation_peak(self)

    def warm_up_steps(self) -> bool:
        """Before serving: run the step shapes a first occurrence would compile or allocate
        for (kvtier/runner/startup.py). Returns whether the steps ran."""
        return warm_up_steps(self)

    def close(self) -> None:
        """Drop every tensor this runner owns (weights, pools, graphs) and return the memory."""
        self.copies.close()  # the copies end, and it drops its references to the pools
        if self.external is not None:
            self.external.close()
            self.external = None
        self.graphs = None
        self.gpu_kv = self.host_kv = None
        self.hidden = None
        self.model = None  # type: ignore[assignment]
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # ---- one step ----------------------------------------------------------------------
    def execute(self, plan: StepPlan) -> StepResult:
        return self.launch(plan).result()

    @torch.inference_mode()
    def launch(self, plan: StepPlan) -> PendingStep:
        """Issue the step and return before its tokens are on the host (plain greedy
        batches; other sampling reads its tokens back here). Under async scheduling the
        engine launches the next step before asking for this one's result."""
        for rid in (*plan.finished_ids, *plan.preempted_ids):
            self.block_tables.remove(rid)
            self.penalties.forget(rid)
            if self.hidden is not None:
                self.hidden.forget(rid)
        items = by_kind(plan.items) if plan.items else {}
        if items:  # the memory systems' own work, one hook per kind
            run_items(self, items)
        if not plan.scheduled:
            self.copy_blocks(plan.swap_out, plan.swap_in)
            return PendingStep(ready=StepResult(sampled={}))
        batch = self.prepare_batch(plan.scheduled, group_of(items, RecomputePrefix))
        # After the batch: it lends offloaded prefixes scratch blocks to copy into.
        now, later = window_prefix_copies(self, batch.prefix_copies)
        self.copy_blocks(plan.swap_out, [*plan.swap_in, *now], later)
        self._placeholders = self.async_tokens.placeholder_sources(plan.scheduled,
                                                                   batch.input_ids)
        if self.hidden is not None:
            self.hidden.apply(group_of(items, HiddenBlocks))
            assert self.gpu_kv is not None
            self.copies.wait_all()  # restores write the KV pool outside the layers
            self.hidden.restore(group_of(items, HiddenRestore), self.block_tables, self.gpu_kv,
                                self.ops, self.cos_sin, self.layers_per_block)
        external = (self.external.for_step(plan.scheduled, batch, items)
                    if self.external is not None else None)
        logits, prompt_lps = forward_scored(self, plan.scheduled, batch, external)
        if self.hidden is not None:
            self.hidden.store(plan.scheduled, batch)
        if logits is None:
            return PendingStep(ready=StepResult(sampled={}, prompt_logprobs=prompt_lps))
        return self._sample(logits, plan.scheduled, prompt_lps)

    def _sample(self, logits: torch.Tensor, scheduled: list[ScheduledRequest],
                prompt_lps: PromptLogprobs) -> PendingStep:
        """The step's tokens kept on the device for the next step's placeholders and the
        penalized rows' counts; read back later, without a sync here, unless logprobs are
        asked for (or under TP, whose ranks take the driver's draws)."""
        # C-level getters over the (up to max_num_seqs) scheduled requests.
        sampling = list(compress(scheduled, map(_sample_flag, scheduled)))
        rows, ids = list(map(self._sample_row, sampling)), list(map(_request_id, sampling))
        tokens, greedy, put = self.async_tokens, sampler.plain_greedy(rows), self.staging.put
        view = None if greedy else self.penalties.view(ids, rows, logits, put)
        if greedy or (self.tp is None and not sampler.wants_logprobs(rows)):
            sampled = (self.ops.argmax_rows(logits) if greedy
                       else sampler.sample_on_device(logits, rows, put, view))
            self.penalties.record(view, sampled)
            tokens.keep(ids, sampled)
            return tokens.copy_to_host(ids, sampled, prompt_lps)
        out = (sampler.sample(logits, rows, put, view) if self.tp is None
               else self.tp.sample(logits, rows, put, view))
        tokens.keep(ids, drawn := put(np.asarray(out.token_ids, dtype=np.int64)))
        self.penalties.record(view, drawn)
        return PendingStep(ready=StepResult(sampled=dict(zip(ids, out.token_ids)),
                                            logprobs=out.logprobs_by_id(ids),
                                            prompt_logprobs=prompt_lps))

    def prepare_batch(self, scheduled: list[ScheduledRequest],
                      prefixes: Sequence[RecomputePrefix] = ()) -> HostBatch:
        """A step's host batch, with the device block tables brought up to date: what a
        forward needs before `device_inputs` (also the seam the cost-model profiler uses).
        `prefixes`: the plan's dropped prefixes to recompute."""
        self.staging.next_step()
        batch = build_host_batch(scheduled, self.block_tables, self.block_size,
                                 self.recompute_scratch, copy_window(self), list(prefixes))
        self.block_tables.sync_device(self.staging.put)
        return batch

    def forward_logits(self, batch: HostBatch, external: ExternalRows | None = None,
                       extra_rows: np.ndarray | None = None) -> torch.Tensor | None:
        """Logits ([rows, vocab], model dtype) of the sampling requests' last tokens, then of
        `extra_rows` (token indices: prompt rows scored for their logprobs). `external`:
        leading rows a memory system attends for (a full-model graph only where its source
        hands over rows a graph can replay)."""
        copies = self.copies
        # Swap-ins under overlap: the piecewise graphs wait between layer groups, the full
        # graph could not (it would wait for every copy before its first kernel).
        if (self.graphs is not None and batch.is_decode_only and extra_rows is None
                and len(batch.logits_idx) == batch.num_reqs
                and not (copies.has_swap_in and copies.streams.overlaps
                         and self.piecewise is not None)):
            graph_rows = (self.external.graph_rows(external)
                          if external is not None and self.external is not None else None)
            if external is None or graph_rows is not None:
                copies.wait_all()
                logits = self.graphs.run(batch, self._fill_placeholders, graph_rows)
                if logits is not None:
                    return logits
        input_ids, positions, meta = self.device_inputs(batch)
        meta.external = external
        self._fill_placeholders(input_ids)
        assert self.gpu_kv is not None, "allocate_kv first"
        hidden = None
        kv_wait = copies.wait_layer if copies.pending else None
        sink = self.hidden.sink(batch.num_tokens) if self.hidden is not None else None
        truncate = self._prefix_truncation(batch, meta)
        kv_after = copies.after_layer if copies.deferred else None
        rows = batch.logits_idx if extra_rows is None else np.r_[batch.logits_idx, extra_rows]
        n = len(rows)
        idx = self.staging.put(self._padded_logits_idx(rows))
        # Past the last attention only the rows with logits go on (none in a step of prompt
        # chunks that all continue); forwards truncated for offloaded prefixes keep every row.
        keep = idx if truncate is None else None
        if external is not None and self.external is not None:  # the system's own forward
            own = self.external.run_forward(input_ids, positions, meta)
            if own is not None:
                return self.model.compute_logits(own[idx])[:n] if n else None
        if self.piecewise is not None:
            if keep is not None and self.piecewise.padded(keep.shape[0]) is None:
                keep = None
            hidden = self.piecewise.forward(input_ids, positions, meta, kv_wait, sink, truncate,
                                            kv_after, keep)
        if truncate is not None and hidden is None:
            raise RuntimeError("an offloaded dropped prefix needs the piecewise forward")
        if copies.deferred:
            raise RuntimeError("prefix copies held back for layers the forward never ran")
        if hidden is None:
            ctx = ForwardContext(self.ops, self.attention, self.gpu_kv, meta, self.cos_sin, sink,
                                 kv_wait)
            hidden = self.model(input_ids, positions, ctx, keep)
        if n == 0:
            return None
        return self.model.compute_logits(hidden if keep is not None else hidden[idx])[:n]

    def _padded_logits_idx(self, idx: np.ndarray) -> np.ndarray:
        """On GPUs the LM head of a step with prefill rows runs eagerly over however many rows
        sample; padded (repeating the last row) to the decode graphs' batch sizes, it meets
        a handful of GEMM shapes, all run once at start-up (`warm_up_steps`), instead of a
        new shape — a cuBLAS heuristic lookup and possibly a kernel module loaded on first
        use — for each new count. The head reads its whole weight at any such size, so the
        padding costs no time that matters."""
        if self.device.type != "cuda":
            return idx
        return pad_rows(idx, self.graph_sizes)

    def _prefix_truncation(self, batch: HostBatch, meta: AttentionMetadata
                           ) -> tuple[int, AttentionMetadata] | None:
        return prefix_truncation(self, batch, meta)

    def _fill_placeholders(self, input_ids: torch.Tensor) -> None:
        """Async scheduling: the in-flight tokens into this step's device input ids."""
        if self._placeholders is not None:
            self.async_tokens.fill(input_ids, self._placeholders, self.staging.put)

    def copy_blocks(self, swap_out: list[BlockCopy], swap_in: list[BlockCopy],
                     deferred: dict[int, list[tuple[int, list]]] | None = None) -> None:
        """All swap-outs, then the swap-ins layer group by layer group (a device block freed
        by a swap-out may be the target of a swap-in in the same step); the forward waits
        per group (`SwapCopies`).

        Straight between the device pool and the pinned host pool, one copy per run of
        consecutive blocks (`copy_blocks`): a block is hundreds of KiB to a few MiB (F
        layers x block_size tokens), where a single cudaMemcpyAsync already runs near PCIe
        speed (the hw probe, shared/hw/h200_probe_2026-11-30.json), so runs save the
        host's per-call cost, and no pageable staging copy is made on either side.
        """
        gpu, host = self.gpu_kv, self.host_kv
        assert gpu is not None and host is not None
        self.copies.issue(gpu, host, swap_out, swap_in, deferred)

    def device_inputs(
        self, batch: HostBatch
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata]:
        staging = self.staging

        def put(a: np.ndarray, dtype=None) -> torch.Tensor:
            return staging.put(a if dtype is None else a.astype(dtype))

        tables = self.block_tables.gather_device(put(batch.rows), batch.max_blocks)  # [G, B, w]
        meta = AttentionMetadata(
            num_tokens=batch.num_tokens,
            num_reqs=batch.num_reqs,
            num_decodes=batch.num_decodes,
            max_query_len=int(batch.query_lens.max()),
            max_seq_len=int(batch.seq_lens.max()),
            query_start_loc=put(batch.query_start_loc, np.int32),
            seq_lens=put(batch.seq_lens, np.int32),
            block_tables=tables,
            slot_mapping=put(batch.slots),
            layers_per_block=self.layers_per_block,
            block_size=self.block_size,
            query_lens_cpu=batch.query_lens.tolist(),
            seq_lens_cpu=batch.seq_lens.tolist(),
            decode_order=put(batch.decode_order) if batch.num_decodes else None,
        )
        return put(batch.input_ids), put(batch.positions), meta
