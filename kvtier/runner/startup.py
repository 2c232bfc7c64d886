"""The model runner before serving: the activation peak that sizes the pools, and warm-up
steps that pay, before the first request, whatever a step shape's first occurrence compiles
or allocates."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.kv.manager import cdiv
from kvtier.sampling_params import SamplingParams

if TYPE_CHECKING:
    from kvtier.runner.model_runner import ModelRunner

_PROFILE_PARAMS = SamplingParams(temperature=0.0, max_tokens=1)


@torch.inference_mode()
def profile_activation_peak(runner: ModelRunner) -> int:
    """Peak activation bytes of the largest step (GPU only): run one forward over
    max_num_batched_tokens dummy tokens and read the allocator's high-water mark."""
    if runner.device.type != "cuda":
        return 0
    sched = runner.config.scheduler
    total = sched.max_num_batched_tokens
    lens: list[int] = []
    while total > 0 and len(lens) < sched.max_num_seqs:
        lens.append(min(total, sched.max_model_len))
        total -= lens[-1]
    blocks = [cdiv(n, runner.block_size) for n in lens]
    shape = runner.block_shape()
    runner.gpu_kv = torch.zeros((sum(blocks), *shape), dtype=runner.dtype, device=runner.device)
    runner.host_kv = torch.empty((0, *shape), dtype=runner.dtype)
    torch.cuda.synchronize(runner.device)
    torch.cuda.reset_peak_memory_stats(runner.device)
    base = torch.cuda.memory_allocated(runner.device)
    plan, first = [], 0
    for i, (n, nb) in enumerate(zip(lens, blocks)):
        ids = tuple(range(first, first + nb))
        first += nb
        plan.append(ScheduledRequest(
            request_id=f"__profile{i}", token_ids=[0] * n, start_pos=0,
            new_block_ids=(ids,) * runner.num_groups, reset_blocks=True, sample=True,
            sampling_params=_PROFILE_PARAMS, num_output_tokens=0))
    runner.execute(StepPlan(scheduled=plan))
    torch.cuda.synchronize(runner.device)
    peak = torch.cuda.max_memory_allocated(runner.device) - base
    for p in plan:
        runner.block_tables.remove(p.request_id)
    runner.gpu_kv = runner.host_kv = None
    torch.cuda.empty_cache()
    return int(peak)

@torch.inference_mode()
def warm_up_steps(runner: ModelRunner) -> bool:
    """Before serving: a small mixed step (decodes beside a prefill and a prefix-cached chunk), the
    largest mixed step the budget allows (max_num_seqs - 1 decodes at the longest context
    beside prefill rows filling max_num_batched_tokens), and a decode-only step. Whatever a
    first occurrence compiles or allocates is then not paid inside a request's step: a first
    mixed step would compile, and while the caching allocator grows each new segment's
    cudaMalloc is a sync in the middle of a piecewise step that leaves the GPU waiting on
    the host's remaining launches (results/fidelity/fidelity_h200.md). The largest step's
    memory was reserved for activations when the pools were sized, so it stays cached.
    Every row reads and writes the same first blocks of the pool: garbage KV in free
    blocks is harmless, a block is always written before it is read. The
    hidden-state store keeps per-request rows of its own, so it is left out. Returns
    whether the steps ran."""
    if runner.hidden is not None or runner.gpu_kv is None:
        return False
    sched, bs = runner.config.scheduler, runner.block_size
    if cdiv(sched.max_model_len, bs) > len(runner.gpu_kv) - 1:
        return False  # a pool too small to share (tiny test pools)
    # No more rows than the block tables hold (an engine of 4 seats crashed here).
    small = [(19, 1), (33, 1), (7, 1), (0, 31), (16, 17)][: sched.max_num_seqs]
    decodes = min(sched.max_num_seqs - 1, sched.max_num_batched_tokens // 2)
    large = [(sched.max_model_len - 2, 1)] * decodes
    rest, longest = sched.max_num_batched_tokens - decodes, sched.max_model_len - 1
    while rest > 0 and len(large) < sched.max_num_seqs:
        large.append((0, min(rest, longest)))
        rest -= large[-1][1]
    last: list[ScheduledRequest] = []
    for rows in (small, large):
        last = [_warm_row(runner, i, start, n) for i, (start, n) in enumerate(rows)]
        runner.execute(StepPlan(scheduled=last))
        for sr in last:
            runner.block_tables.remove(sr.request_id)
    if runner.graphs is None:  # every padded LM-head shape (the graphs' capture ran them)
        for size in runner.graph_sizes:
            runner.model.compute_logits(torch.zeros(size, runner.model_config.hidden_size,
                                                  dtype=runner.dtype, device=runner.device))
    short = [_warm_row(runner, i, start, n) for i, (start, n) in enumerate(small)]
    runner.execute(StepPlan(scheduled=short))
    runner.execute(StepPlan(scheduled=[
        ScheduledRequest(sr.request_id, [1], sr.seq_len, ((),) * runner.num_groups, False,
                         True, _PROFILE_PARAMS, 1) for sr in short]))
    for sr in short:
        runner.block_tables.remove(sr.request_id)
    if runner.device.type == "cuda":
        torch.cuda.synchronize(runner.device)
    return True


def _warm_row(runner: ModelRunner, i: int, start: int, n: int) -> ScheduledRequest:
    """A warm-up row of n tokens from position `start`, over the pool's first blocks."""
    ids = tuple(range(cdiv(start + n + 1, runner.block_size)))
    return ScheduledRequest(request_id=f"__warm{i}", token_ids=[1] * n, start_pos=start,
                            new_block_ids=(ids,) * runner.num_groups, reset_blocks=True,
                            sample=True, sampling_params=_PROFILE_PARAMS, num_output_tokens=0)

