"""The simulator makes the real engine's scheduling decisions: same batches (request ids,
token counts, positions), same preemptions, same swap copies block for block, step for step,
when it is given the real outputs' lengths. Both engines run the same workload with arrivals
fixed to step numbers, so no decision depends on either engine's notion of time."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from kvtier.core.plan import (
    HiddenBlocks,
    HiddenRestore,
    RecomputePrefix,
    StepPlan,
    StepResult,
    items_of,
)
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import SamplingParams
from kvtier.sim.engine import build_sim_engine


def decision(plan: StepPlan) -> tuple:
    prefix = {p.request_id: len(p.token_ids) for p in items_of(plan, RecomputePrefix)}
    hidden = {h.request_id: h.block_ids for h in items_of(plan, HiddenBlocks)}
    return (tuple((s.request_id, len(s.token_ids), s.start_pos, s.sample, s.reset_blocks,
                   s.new_block_ids, prefix.get(s.request_id, 0), hidden.get(s.request_id, ()))
                  for s in plan.scheduled),
            tuple((c.src, c.dst) for c in plan.swap_out),
            tuple((c.src, c.dst) for c in plan.swap_in),
            tuple((r.request_id, r.num_tokens) for r in items_of(plan, HiddenRestore)),
            tuple(plan.preempted_ids), tuple(plan.finished_ids))


class PlanLog:
    def __init__(self, inner):
        self.inner, self.plans = inner, []

    def execute(self, plan: StepPlan) -> StepResult:
        self.plans.append(decision(plan))
        return self.inner.execute(plan)


@dataclass(frozen=True)
class Job:
    step: int  # joins before this engine step
    rid: str
    prompt: list[int]
    params: SamplingParams


def drive(engine: LLMEngine, jobs: list[Job]) -> tuple[list[tuple], dict[str, list[int]]]:
    log = PlanLog(engine.executor)
    engine.executor = log
    pending = sorted(jobs, key=lambda j: j.step)
    outputs: dict[str, list[int]] = {}
    step = 0
    while pending or engine.has_unfinished_requests():
        while pending and pending[0].step <= step:
            j = pending.pop(0)
            engine.add_request(j.rid, j.prompt, j.params)
        for out in engine.step():
            if out.finished:
                outputs[out.request_id] = out.outputs[0].token_ids
        engine.check_integrity()
        step += 1
        assert step < 5000, "the workload does not finish"
    return log.plans, outputs


def workload(seed: int, n: int = 14) -> list[tuple[int, str, list[int], int]]:
    rng = random.Random(seed)
    return [(rng.randint(0, 15), f"r{i}", [rng.randrange(100, 4000) for _ in range(rng.randint(5, 90))],
             rng.randint(3, 60)) for i in range(n)]


def args(policy: str, host_blocks: int) -> EngineArgs:
    # 16 blocks of 16 tokens for one layer group (tiny-llama: 4 layers, F = 4): ~5 requests'
    # worth, so the scheduler preempts all the time.
    # ellm: the ridge rule explicitly — `auto` would pick it for the CPU engine but nothing
    # for the simulated GPU, whose decode steps replay CUDA graphs.
    return EngineArgs(model="tiny-llama", load_format="dummy", kv_policy=policy, num_gpu_blocks=16,
                      num_host_blocks=host_blocks, max_model_len=256, max_num_batched_tokens=96,
                      max_num_seqs=8, ellm_recompute_budget="ridge")


def real_run(policy: str, host_blocks: int, seed: int):
    """Pass 1 learns each greedy output; pass 2 (the reference) stops most requests at a token
    they emit, so outputs end at mixed lengths, as real models' do."""
    rng = random.Random(seed + 1)
    jobs = workload(seed)
    greedy = {rid: SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=False)
              for _, rid, _, m in jobs}
    _, first = drive(LLMEngine.from_engine_args(args(policy, host_blocks)),
                     [Job(s, rid, p, greedy[rid]) for s, rid, p, _ in jobs])
    final = []
    for s, rid, p, m in jobs:
        out = first[rid]
        stop = [out[rng.randrange(1, len(out))]] if len(out) > 2 and rng.random() < 0.7 else []
        final.append(Job(s, rid, p, SamplingParams(temperature=0.0, max_tokens=m,
                                                    stop_token_ids=stop, detokenize=False)))
    plans, outs = drive(LLMEngine.from_engine_args(args(policy, host_blocks)), final)
    return final, plans, outs


@pytest.mark.parametrize("policy,host_blocks,seed", [
    ("recompute", 0, 0), ("recompute", 0, 1), ("swap", 64, 0), ("swap", 64, 2),
    ("swap", 6, 3),  # a small host pool: some victims fall back to recompute
    ("ellm", 0, 0), ("ellm", 0, 4),  # prefixes dropped on demand, recomputed every step
    ("hcache", 0, 0), ("hcache", 0, 5),  # victims come back from their hidden states
])
def test_simulator_makes_the_real_schedulers_decisions(policy, host_blocks, seed):
    jobs, real_plans, real_out = real_run(policy, host_blocks, seed)
    lengths = {rid: len(toks) for rid, toks in real_out.items()}
    assert len(set(lengths.values())) > 3, "want mixed output lengths"
    sim = build_sim_engine(args(policy, host_blocks), "h200", output_lens=lengths)
    sim_jobs = [Job(j.step, j.rid, j.prompt, SamplingParams(
        temperature=0.0, max_tokens=j.params.max_tokens, detokenize=False)) for j in jobs]
    sim_plans, sim_out = drive(sim, sim_jobs)
    assert {rid: len(t) for rid, t in sim_out.items()} == lengths
    preempted = sum(len(p[4]) for p in real_plans)
    assert preempted > 0 or policy == "ellm", "the workload must preempt"
    if policy == "swap":
        assert any(p[1] for p in real_plans), "the workload must swap"
    if policy == "ellm":
        assert any(s[6] for p in real_plans for s in p[0]), "the workload must drop prefixes"
    if policy == "hcache":
        assert any(p[3] for p in real_plans), "the workload must restore from hidden states"
    assert len(sim_plans) == len(real_plans)
    for i, (r, s) in enumerate(zip(real_plans, sim_plans)):
        assert r == s, f"step {i} differs"
