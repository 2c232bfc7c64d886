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
from kvtier.kv.prefix_cache import PrefixCacheStats
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


def drive(engine: LLMEngine, jobs: list[Job]
          ) -> tuple[list[tuple], dict[str, list[int]], PrefixCacheStats | None]:
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
    cache = engine.scheduler.kv.prefix_cache
    return log.plans, outputs, cache.stats if cache is not None else None


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


def shared_prefix_workload(seed: int, n: int = 16) -> list[tuple[int, str, list[int], int]]:
    """Prompts that share prefixes: each is one of three documents (20-70 tokens) and a
    question of its own, or an earlier prompt again; misses, partial and whole hits."""
    rng = random.Random(seed)
    docs = [[rng.randrange(100, 4000) for _ in range(rng.randint(20, 70))] for _ in range(3)]
    jobs: list[tuple[int, str, list[int], int]] = []
    for i in range(n):
        if jobs and rng.random() < 0.2:
            prompt = list(rng.choice(jobs)[2])
        else:
            prompt = rng.choice(docs) + [rng.randrange(100, 4000) for _ in range(rng.randint(3, 30))]
        jobs.append((rng.randint(0, 20), f"r{i}", prompt, rng.randint(3, 60)))
    return jobs


def real_run(policy: str, host_blocks: int, seed: int, make_workload=workload):
    """Pass 1 learns each greedy output; pass 2 (the reference) stops most requests at a token
    they emit, so outputs end at mixed lengths, as real models' do."""
    rng = random.Random(seed + 1)
    jobs = make_workload(seed)
    greedy = {rid: SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True, detokenize=False)
              for _, rid, _, m in jobs}
    _, first, _ = drive(LLMEngine.from_engine_args(args(policy, host_blocks)),
                        [Job(s, rid, p, greedy[rid]) for s, rid, p, _ in jobs])
    final = []
    for s, rid, p, m in jobs:
        out = first[rid]
        stop = [out[rng.randrange(1, len(out))]] if len(out) > 2 and rng.random() < 0.7 else []
        final.append(Job(s, rid, p, SamplingParams(temperature=0.0, max_tokens=m,
                                                    stop_token_ids=stop, detokenize=False)))
    plans, outs, cache = drive(LLMEngine.from_engine_args(args(policy, host_blocks)), final)
    return final, plans, outs, cache


@pytest.mark.parametrize("policy,host_blocks,seed", [
    ("recompute", 0, 0), ("recompute", 0, 1), ("swap", 64, 0), ("swap", 64, 2),
    ("swap", 6, 3),  # a small host pool: some victims fall back to recompute
    ("ellm", 0, 0), ("ellm", 0, 4),  # prefixes dropped on demand, recomputed every step
    ("hcache", 0, 0), ("hcache", 0, 5),  # victims come back from their hidden states
])
def test_simulator_makes_the_real_schedulers_decisions(policy, host_blocks, seed):
    jobs, real_plans, real_out, _ = real_run(policy, host_blocks, seed)
    sim_plans = simulated_plans(policy, host_blocks, jobs, real_out)
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


def simulated_plans(policy: str, host_blocks: int, jobs: list[Job],
                    real_out: dict[str, list[int]]) -> list[tuple]:
    """The simulator's plans for the real run's jobs, told the real outputs' lengths."""
    lengths = {rid: len(toks) for rid, toks in real_out.items()}
    assert len(set(lengths.values())) > 3, "want mixed output lengths"
    sim = build_sim_engine(args(policy, host_blocks), "h200", output_lens=lengths)
    sim_jobs = [Job(j.step, j.rid, j.prompt, SamplingParams(
        temperature=0.0, max_tokens=j.params.max_tokens, detokenize=False)) for j in jobs]
    sim_plans, sim_out, _ = drive(sim, sim_jobs)
    assert {rid: len(t) for rid, t in sim_out.items()} == lengths
    return sim_plans


@pytest.mark.parametrize("policy,host_blocks,seed", [
    ("recompute", 0, 0), ("recompute", 0, 1), ("swap", 64, 0), ("swap", 6, 2), ("ellm", 0, 0),
])
def test_simulator_makes_the_real_schedulers_decisions_with_prefix_hits(policy, host_blocks, seed):
    """Caching on (the default): hits shorten prefills, evictions and preemptions change
    what later requests find cached; the simulator still plans every step the same."""
    jobs, real_plans, real_out, stats = real_run(policy, host_blocks, seed, shared_prefix_workload)
    assert stats is not None and stats.hits > 0, "the workload must hit the prefix cache"
    assert stats.evicted_blocks > 0, "the workload must evict cached blocks"
    first_chunks = {}
    for plan in real_plans:
        for rid, _, start, *_ in plan[0]:
            first_chunks.setdefault(rid, start)
    assert any(first_chunks.values()), "some request must start at a cached offset"
    sim_plans = simulated_plans(policy, host_blocks, jobs, real_out)
    assert len(sim_plans) == len(real_plans)
    for i, (r, s) in enumerate(zip(real_plans, sim_plans)):
        assert r == s, f"step {i} differs"
