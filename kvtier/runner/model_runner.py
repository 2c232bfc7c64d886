"""The model runner: the one place that owns tensors (weights, KV pools, batch inputs).

Executes a StepPlan: block copies between pools, then one forward pass over all scheduled
tokens, then sampling for the requests that reached the end of their known tokens.
"""

from __future__ import annotations

import numpy as np
import torch

from kvtier.attention.metadata import AttentionMetadata
from kvtier.config import EngineConfig
from kvtier.core.plan import BlockCopy, ScheduledRequest, StepPlan, StepResult
from kvtier.kv.manager import cdiv
from kvtier.model.llama import ForwardContext
from kvtier.model.loader import build_model
from kvtier.model.ops import TorchOps
from kvtier.model.rope import cos_sin_cache
from kvtier.runner.block_tables import BlockTables
from kvtier.runner.device import make_attention_backend, make_ops
from kvtier.runner.sampler import SampleRow, sample
from kvtier.sampling_params import SamplingParams

_PROFILE_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


class ModelRunner:
    def __init__(self, config: EngineConfig, ckpt, device: torch.device, dtype: torch.dtype):
        self.config, self.device, self.dtype = config, device, dtype
        mc = config.model_config
        self.model_config = mc
        self.model = build_model(mc, ckpt, dtype, device, config.seed)
        self.ops: TorchOps = make_ops(config.attention_backend, device)
        self.attention = make_attention_backend(config.attention_backend, device)
        self.cos_sin = cos_sin_cache(mc, config.scheduler.max_model_len, device)
        cache = config.cache
        self.block_size = cache.block_size
        self.layers_per_block = cache.layers_in_block(mc.num_layers)
        self.num_groups = cache.num_layer_groups(mc.num_layers)
        self.block_tables = BlockTables(
            self.num_groups, config.scheduler.max_num_seqs,
            cdiv(config.scheduler.max_model_len, self.block_size),
        )
        self.gpu_kv: torch.Tensor | None = None
        self.host_kv: torch.Tensor | None = None

    # ---- memory ------------------------------------------------------------------------
    def block_shape(self) -> tuple[int, ...]:
        mc = self.model_config
        return (self.layers_per_block, 2, self.block_size, mc.num_kv_heads, mc.head_dim)

    def allocate_kv(self, num_gpu_blocks: int, num_host_blocks: int) -> None:
        shape = self.block_shape()
        self.gpu_kv = torch.empty((num_gpu_blocks, *shape), dtype=self.dtype, device=self.device)
        pin = self.device.type == "cuda"
        self.host_kv = torch.empty((num_host_blocks, *shape), dtype=self.dtype, pin_memory=pin)

    @torch.inference_mode()
    def profile_activation_peak(self) -> int:
        """Peak activation bytes of the largest step (GPU only): run one forward over
        max_num_batched_tokens dummy tokens and read the allocator's high-water mark."""
        if self.device.type != "cuda":
            return 0
        sched = self.config.scheduler
        total = sched.max_num_batched_tokens
        lens: list[int] = []
        while total > 0 and len(lens) < sched.max_num_seqs:
            lens.append(min(total, sched.max_model_len))
            total -= lens[-1]
        blocks = [cdiv(n, self.block_size) for n in lens]
        self.allocate_kv(sum(blocks), 0)
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        base = torch.cuda.memory_allocated(self.device)
        plan, first = [], 0
        for i, (n, nb) in enumerate(zip(lens, blocks)):
            ids = tuple(range(first, first + nb))
            first += nb
            plan.append(ScheduledRequest(
                request_id=f"__profile{i}", token_ids=[0] * n, start_pos=0,
                new_block_ids=(ids,) * self.num_groups, reset_blocks=True, sample=True,
                sampling_params=_PROFILE_PARAMS, num_output_tokens=0))
        self.execute(StepPlan(scheduled=plan))
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device) - base
        self.execute(StepPlan(scheduled=[], finished_ids=[p.request_id for p in plan]))
        self.gpu_kv = self.host_kv = None
        torch.cuda.empty_cache()
        return int(peak)

    # ---- one step ----------------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, plan: StepPlan) -> StepResult:
        for rid in (*plan.finished_ids, *plan.preempted_ids):
            self.block_tables.remove(rid)
        self._copy_blocks(plan.swap_out, plan.swap_in)
        if not plan.scheduled:
            return StepResult(sampled={})
        input_ids, positions, meta, logits_idx = self._prepare(plan.scheduled)
        assert self.gpu_kv is not None, "allocate_kv first"
        ctx = ForwardContext(self.ops, self.attention, self.gpu_kv, meta, self.cos_sin)
        hidden = self.model(input_ids, positions, ctx)
        sampling = [sr for sr in plan.scheduled if sr.sample]
        if not sampling:
            return StepResult(sampled={})
        logits = self.model.compute_logits(hidden[logits_idx])
        out = sample(logits, [self._sample_row(sr) for sr in sampling])
        ids = [sr.request_id for sr in sampling]
        logprobs = {i: lp for i, lp in zip(ids, out.logprobs) if lp is not None}
        return StepResult(sampled=dict(zip(ids, out.token_ids)), logprobs=logprobs)

    def _sample_row(self, sr: ScheduledRequest) -> SampleRow:
        p = sr.sampling_params
        banned: tuple[int, ...] = ()
        if sr.num_output_tokens < p.min_tokens:
            eos = () if p.ignore_eos else self.model_config.eos_token_ids
            banned = tuple(eos) + tuple(p.stop_token_ids)
        return SampleRow(p, sr.num_output_tokens, banned)

    def _copy_blocks(self, swap_out: list[BlockCopy], swap_in: list[BlockCopy]) -> None:
        assert self.gpu_kv is not None and self.host_kv is not None
        if swap_out:  # all outs before all ins: a freed device block may be reused below
            src = torch.tensor([c.src for c in swap_out], device=self.device)
            dst = torch.tensor([c.dst for c in swap_out])
            self.host_kv.index_copy_(0, dst, self.gpu_kv.index_select(0, src).cpu())
        if swap_in:
            src = torch.tensor([c.src for c in swap_in])
            dst = torch.tensor([c.dst for c in swap_in], device=self.device)
            staged = self.host_kv.index_select(0, src).to(self.device, non_blocking=True)
            self.gpu_kv.index_copy_(0, dst, staged)

    def _prepare(
        self, scheduled: list[ScheduledRequest]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor]:
        """Batch tensors for the forward: all numpy on the host, then one copy each."""
        rows = np.array([self.block_tables.apply(sr) for sr in scheduled], dtype=np.int64)
        q_lens = np.array([sr.num_new_tokens for sr in scheduled], dtype=np.int64)
        starts = np.array([sr.start_pos for sr in scheduled], dtype=np.int64)
        seq_lens = starts + q_lens
        cu = np.zeros(len(scheduled) + 1, dtype=np.int64)
        np.cumsum(q_lens, out=cu[1:])
        num_tokens = int(cu[-1])
        token_req = np.repeat(np.arange(len(scheduled)), q_lens)
        positions = starts[token_req] + (np.arange(num_tokens) - cu[:-1][token_req])
        input_ids = np.fromiter(
            (t for sr in scheduled for t in sr.token_ids), dtype=np.int64, count=num_tokens
        )
        bs = self.block_size
        max_blocks = int(cdiv(int(seq_lens.max()), bs))
        tables = self.block_tables.table[:, rows, :max_blocks]  # [G, B, max_blocks]
        block_of_token = self.block_tables.table[:, rows[token_req], positions // bs]  # [G, T]
        slots = block_of_token.astype(np.int64) * bs + positions % bs
        logits_idx = np.array([cu[i + 1] - 1 for i, sr in enumerate(scheduled) if sr.sample])
        dev = self.device
        num_decodes = int(np.argmax(q_lens != 1)) if (q_lens != 1).any() else len(scheduled)
        meta = AttentionMetadata(
            num_tokens=num_tokens,
            num_reqs=len(scheduled),
            num_decodes=num_decodes,
            max_query_len=int(q_lens.max()),
            max_seq_len=int(seq_lens.max()),
            query_start_loc=torch.from_numpy(cu.astype(np.int32)).to(dev, non_blocking=True),
            seq_lens=torch.from_numpy(seq_lens.astype(np.int32)).to(dev, non_blocking=True),
            block_tables=torch.from_numpy(np.ascontiguousarray(tables)).to(dev, non_blocking=True),
            slot_mapping=torch.from_numpy(slots).to(dev, non_blocking=True),
            layers_per_block=self.layers_per_block,
            block_size=bs,
            query_lens_cpu=q_lens.tolist(),
            seq_lens_cpu=seq_lens.tolist(),
        )
        return (
            torch.from_numpy(input_ids).to(dev, non_blocking=True),
            torch.from_numpy(positions).to(dev, non_blocking=True),
            meta,
            torch.from_numpy(logits_idx.astype(np.int64)).to(dev, non_blocking=True),
        )
