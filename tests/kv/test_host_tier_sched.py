"""The host tier (kvtier/kv/host_tier.py) through the real scheduler and KV manager, with a
tensor-free executor whose blocks carry their content: every block holds a tag (layer
group, the token ids of its whole prefix), host pages too; a step that reads a block whose
tag is not its request's prefix fails. A device pool too small for the prefix working set
forces evictions and host hits; check_integrity (both tiers) after every step."""

from __future__ import annotations

import random

import pytest

from kvtier.config import SchedulerConfig
from kvtier.core.plan import RecomputePrefix, StepPlan, StepResult, items_of
from kvtier.core.request import Request, RequestStatus
from kvtier.kernels.host_page_backends import PageIOConfig
from kvtier.kv.host_tier import HostTierConfig, WritePolicy
from kvtier.kv.host_tier_items import HostBackup, HostLoad, HostPrefetch, HostStore
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.offload.args import HostTierOptions
from kvtier.offload.install import attach_index
from kvtier.offload.scheduling import CacheAwareAdmission
from kvtier.policies import get_policy
from kvtier.policies.ellm import EllmOptions
from kvtier.runner.block_tables import BlockTables
from kvtier.sampling_params import SamplingParams
from kvtier.scheduler.scheduler import Scheduler

B = 4


class ContentExecutor:
    def __init__(self, sched: Scheduler, num_groups: int, max_len: int):
        self.sched, self.num_groups = sched, num_groups
        self.tables = BlockTables(num_groups, 16, cdiv(max_len, B))
        self.device: dict[int, tuple] = {}
        self.swap: dict[int, tuple] = {}
        self.pages: dict[int, tuple] = {}
        self.loaded = self.stored = 0
        self.seen: dict[str, Request] = {}  # requests by id, aborted ones too

    def execute(self, plan: StepPlan) -> StepResult:
        self.seen.update(self.sched.requests)
        for rid in (*plan.finished_ids, *plan.preempted_ids):
            self.tables.remove(rid)
        for c in plan.swap_out:
            self.swap[c.dst] = self.device[c.src]
        for s in items_of(plan, HostStore):  # after the swap-outs, before any load
            for b, p in zip(s.gpu_blocks, s.host_pages):
                tag = self.device[b]
                assert len(tag[1]) % B == 0, "a store of a block that is not full"
                self.pages[p] = tag
                self.stored += 1
        for ld in items_of(plan, HostLoad):
            for p, b, g in zip(ld.host_pages, ld.gpu_blocks, ld.groups):
                assert self.pages[p][0] == g, "a load from another layer group's page"
                self.device[b] = self.pages[p]
                self.loaded += 1
        for c in plan.swap_in:
            self.device[c.dst] = self.swap[c.src]
        backups = [(b, p, self.device[b]) for s in items_of(plan, HostBackup)
                   for b, p in zip(s.gpu_blocks, s.host_pages)]
        self.written: set[int] = set()
        sampled = self._compute(plan)
        for b, p, tag in backups:  # they run beside the step: nothing in it may write them
            assert self.device[b] == tag and len(tag[1]) % B == 0, "a backup's block changed"
            self.pages[p] = tag
            self.stored += 1
        for pf in items_of(plan, HostPrefetch):  # beside the step too: nothing reads them
            for p, b in zip(pf.host_pages, pf.gpu_blocks):
                assert b not in self.read and b not in self.written, "a prefetch raced"
                self.device[b] = self.pages[p]
                self.loaded += 1
        return StepResult(sampled=sampled)

    def _compute(self, plan: StepPlan) -> dict[str, int]:
        sampled, self.read = {}, set()
        dropped = {p.request_id: len(p.token_ids) for p in items_of(plan, RecomputePrefix)}
        for sr in plan.scheduled:
            row = self.tables.apply(sr)
            req = self.seen[sr.request_id]
            tokens = (req.prompt_token_ids + req.output_token_ids)[: sr.seq_len]
            for g in range(self.num_groups):
                for j in range(dropped.get(sr.request_id, 0) // B, cdiv(sr.seq_len, B)):
                    block = int(self.tables.table[g, row, j])  # (eLLM: past its dropped prefix)
                    if j * B < sr.start_pos:  # read: must hold this prefix
                        want = tuple(tokens[: min((j + 1) * B, sr.start_pos)])
                        tag = self.device.get(block)
                        assert tag is not None and tag[0] == g and \
                            tag[1][: len(want)] == want, (sr.request_id, g, j, tag, want)
                        self.read.add(block)
                    self.device[block] = (g, tuple(tokens[: min((j + 1) * B, sr.seq_len)]))
                    self.written.add(block)
            if sr.sample:
                sampled[sr.request_id] = 10 + (sum(tokens) * 31 + len(tokens)) % 900
        return sampled


def make(policy: WritePolicy, gpu_blocks=24, host_pages=64, num_groups=2, budget=32,
         max_len=64, gate: bool = False, loading_bound: float = 0.0, kv_policy="recompute",
         prefetch: bool = False, max_num_seqs: int = 8, min_load_blocks: int = 1,
         **sched_kw):
    kv = KVCacheManager(num_groups, B, gpu_blocks, 32, watermark=0.0,
                        prefix_cache=PrefixCacheConfig())
    opts = HostTierOptions(HostTierConfig(host_pages, policy, min_load_blocks=min_load_blocks),
                           PageIOConfig(), loading_bound, True, prefetch, "--kv-offloading-size")
    tier = attach_index(kv, opts)
    options = EllmOptions(max_uncached_ratio=0.6, max_recompute_tokens=budget // 2)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                      max_model_len=max_len, **sched_kw), kv,
                      get_policy(kv_policy, options if kv_policy == "ellm" else None))
    if gate:
        sched.admission_gate = CacheAwareAdmission(kv, tier, loading_bound, True, prefetch)
    return sched, tier, ContentExecutor(sched, num_groups, max_len)


def req(rid: str, tokens, max_tokens=4) -> Request:
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   max_tokens=max_tokens)


def run(sched, ex, arrivals, aborts=None, max_steps=3000):
    """arrivals {step: [Request]}; returns {rid: output tokens}."""
    out, step = {}, 0
    while step < max_steps:
        for r in arrivals.get(step, []):
            sched.add_request(r)
        for rid in (aborts or {}).get(step, []):
            sched.finish_request(rid, RequestStatus.FINISHED_ABORTED)
        if step > max(arrivals) and not sched.num_unfinished:
            break
        plan = sched.schedule()
        for r in sched.update(plan, ex.execute(plan)):
            if r.status.finished:
                out[r.request_id] = list(r.output_token_ids)
        sched.check_integrity()
        step += 1
    assert step < max_steps
    return out


def docs_workload(seed=0, n=24):
    """Four documents of 20-28 tokens, each asked about several times, one at a time: the
    working set (about 4 x 7 blocks x 2 groups) outgrows a 24-block pool."""
    rng = random.Random(seed)
    docs = [[rng.randrange(5, 900) for _ in range(rng.randrange(20, 29))] for _ in range(4)]
    return {2 * i: [req(str(i), docs[rng.randrange(4)] + [rng.randrange(5, 900)
                                                        for _ in range(rng.randrange(1, 6))])]
            for i in range(n)}


@pytest.mark.parametrize("policy", list(WritePolicy))
def test_outputs_equal_without_the_host_tier_and_host_hits_happen(policy):
    base_sched, _, base_ex = make(policy, host_pages=0)
    base = run(base_sched, base_ex, docs_workload())
    sched, tier, ex = make(policy)
    got = run(sched, ex, docs_workload())
    assert got == base
    assert tier.stats.hit_blocks > 0 and ex.loaded == tier.stats.loaded_pages > 0
    assert ex.stored == tier.stats.stored_pages > 0
    assert sched.kv.prefix_cache.stats.evicted_blocks > 0


def test_write_back_stores_only_evicted_blocks_and_write_through_every_cached_one():
    counts = {}
    for policy in (WritePolicy.WRITE_BACK, WritePolicy.WRITE_THROUGH):
        sched, tier, ex = make(policy, gpu_blocks=400)  # nothing is ever evicted
        run(sched, ex, docs_workload(n=8))
        counts[policy] = tier.stats.stored_pages
        assert sched.kv.prefix_cache.stats.evicted_blocks == 0
    assert counts[WritePolicy.WRITE_BACK] == 0
    assert counts[WritePolicy.WRITE_THROUGH] == 2 * len(sched.kv.prefix_cache.index)


def test_write_through_selective_copies_a_block_at_its_second_device_hit():
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH_SELECTIVE, gpu_blocks=400)
    doc = list(range(100, 112))  # 3 blocks; 2 of them can hit (the last token computes)
    arrivals = {0: [req("a", doc)], 10: [req("b", doc)]}
    run(sched, ex, arrivals)
    assert tier.stats.stored_pages == 0  # one hit each: not yet
    run(sched, ex, {0: [req("c", doc)]})
    assert tier.stats.stored_pages == 2 * 2 and len(tier.index) == 2


def test_a_hit_counts_once_however_often_its_admission_is_retried():
    """b waits a step (x's prefill leaves too little budget), its admission rolled back and
    retried: one request's hit, so write_through_selective copies nothing yet."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH_SELECTIVE, gpu_blocks=400,
                           enable_chunked_prefill=False, max_len=32)
    doc = list(range(100, 112))
    run(sched, ex, {0: [req("a", doc, max_tokens=1)]})
    sched.add_request(req("x", list(range(300, 328)), max_tokens=4))  # 28 of the 32 tokens
    sched.add_request(req("b", doc + list(range(500, 510)), max_tokens=1))
    waited = False
    for _ in range(3):
        plan = sched.schedule()
        waited |= "b" not in [s.request_id for s in plan.scheduled]
        sched.update(plan, ex.execute(plan))
        sched.check_integrity()
    assert waited and tier.stats.stored_pages == 0


def test_a_full_host_tier_evicts_its_oldest_blocks_and_never_fails():
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, host_pages=10)  # 5 token blocks
    run(sched, ex, docs_workload())
    assert tier.stats.evicted_blocks > 0 and len(tier.index) <= 5
    assert tier.pool.num_free + 2 * len(tier.index) == 10


def test_blocks_loaded_for_a_suffix_shorter_than_a_block_are_cached_in_that_step():
    """b's hit comes back from the host and b computes one token after it (no block filled):
    the loaded blocks join the device index in that step, so c's same prefix hits there."""
    sched, _, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=40)
    doc = list(range(100, 124))
    run(sched, ex, {0: [req("a", doc, max_tokens=1)]})
    run(sched, ex, {0: [req("x", list(range(300, 360)), max_tokens=1)]})  # doc to the host
    sched.add_request(req("b", doc + [7], max_tokens=8))
    plan = sched.schedule()
    assert items_of(plan, HostLoad)
    sched.update(plan, ex.execute(plan))
    sched.check_integrity()
    sched.add_request(req("c", doc + [9], max_tokens=1))
    assert not items_of(sched.schedule(), HostLoad)


def test_an_admission_rolled_back_takes_its_load_back():
    """A host hit whose admission cannot allocate its suffix: the load leaves the plan, the
    blocks it took are free again, the host copies stay."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=16, max_len=64)
    doc = list(range(100, 124))  # 6 blocks
    run(sched, ex, {0: [req("a", doc, max_tokens=1)]})
    other = list(range(300, 328))
    run(sched, ex, {0: [req("x", other, max_tokens=1)]})  # evicts a's blocks (write-through)
    assert len(tier.index) >= 5
    kv = sched.kv
    hog = req("hog", list(range(500, 512)), max_tokens=40)
    sched.add_request(hog)
    plan = sched.schedule()
    ex.execute(plan)
    sched.check_integrity()
    free_before = kv.gpu.num_free + kv.prefix_cache.num_evictable_device_blocks()
    # b's host hit (5 blocks x 2 groups) fits, its 40-token suffix does not
    b = req("b", doc[:21] + list(range(700, 740)), max_tokens=1)
    sched.add_request(b)
    plan = sched.schedule()
    assert not items_of(plan, HostLoad) and b.status is RequestStatus.WAITING
    assert kv.gpu.num_free + kv.prefix_cache.num_evictable_device_blocks() <= free_before
    assert "b" not in kv.tables and tier.stats.loads == 0
    sched.check_integrity()


def test_an_abort_right_after_the_load_was_planned_frees_everything():
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=16)
    doc = list(range(100, 124))
    run(sched, ex, {0: [req("a", doc, max_tokens=1)]})
    run(sched, ex, {0: [req("x", list(range(300, 328)), max_tokens=1)]})
    b = req("b", doc + [7, 8], max_tokens=4)
    sched.add_request(b)
    plan = sched.schedule()
    assert items_of(plan, HostLoad), "b loads its prefix"
    ex.seen["b"] = b
    sched.finish_request("b", RequestStatus.FINISHED_ABORTED)  # before the step has run
    ex.execute(plan)
    sched.check_integrity()
    kv = sched.kv
    assert not kv.tables
    assert kv.gpu.num_used == len(kv.prefix_cache.index) * 2  # only the cache holds blocks
    run(sched, ex, {0: [req("c", doc + [9], max_tokens=2)]})  # the loaded blocks hit


def test_a_second_request_waits_for_the_prefix_being_computed_and_hits_it():
    outs, hits = {}, {}
    for gate in (False, True):
        # Chunks of 8 tokens, two prefills at once: b could start beside a.
        sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=200, budget=32, gate=gate,
                               long_prefill_token_threshold=8, max_num_partial_prefills=2)
        doc = list(range(100, 140))  # 10 blocks, computed 8 tokens a step
        outs[gate] = run(sched, ex, {0: [req("a", doc + [1])], 1: [req("b", doc + [2])]})
        hits[gate] = sched.kv.prefix_cache.stats.hits
        if gate:
            st = sched.admission_gate.stats
            # b first waited with a's first chunk (2 blocks) cached, then hit all 10
            assert st.delayed_requests == 1 and st.delayed_hit_tokens == 40 - 8
    assert outs[False] == outs[True]
    assert hits == {False: 8, True: 40}


def test_a_request_asked_twice_in_one_step_is_put_off_once():
    """A step may walk the waiting queue twice (priority, with swapped requests between):
    the head waiting for a prefix being computed counts one delayed step, not two."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=200, budget=32, gate=True,
                           long_prefill_token_threshold=8, max_num_partial_prefills=2)
    doc = list(range(100, 140))
    sched.add_request(req("a", doc + [1]))
    sched.update(plan := sched.schedule(), ex.execute(plan))
    b = req("b", doc + [2])
    sched.add_request(b)
    plan = sched.schedule()
    gate = sched.admission_gate
    assert gate.stats.delayed_steps == 1 and b.status is RequestStatus.WAITING
    assert not gate.admit_now(b, sched.running, 8)  # the same step's second pass
    assert gate.stats.delayed_steps == 1
    sched.update(plan, ex.execute(plan))
    sched.schedule()
    assert gate.stats.delayed_steps == 2 and gate.stats.delayed_requests == 1


def test_the_loading_bound_spreads_loads_over_steps():
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=40, budget=64, gate=True,
                           loading_bound=0.5)
    docs = [list(range(100 + 40 * k, 124 + 40 * k)) for k in range(3)]
    run(sched, ex, {k: [req(f"w{k}", d, max_tokens=1)] for k, d in enumerate(docs)})
    run(sched, ex, {0: [req("x", list(range(900, 960)), max_tokens=1)]})
    loads_per_step = []
    arrivals = {0: [req(f"q{k}", d + [5], max_tokens=1) for k, d in enumerate(docs)]}
    orig = ex.execute

    def counting(plan):
        loads_per_step.append(len(items_of(plan, HostLoad)))
        return orig(plan)
    ex.execute = counting
    run(sched, ex, arrivals)
    assert sum(loads_per_step) == 3 and max(loads_per_step) == 1
    assert sched.admission_gate.stats.load_bound_steps > 0


def test_a_host_hit_too_short_to_load_is_not_held_back_by_the_loading_bound():
    """q1's 3-block host hit (doc1, evicted to the host by q0's load) is under the minimum
    load (4): q1 computes it, so it is admitted beside q0's load, which a load of its hit
    would put over the bound."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=40, budget=64, gate=True,
                           loading_bound=0.5, min_load_blocks=4)
    doc0, doc1 = list(range(100, 124)), list(range(200, 212))
    run(sched, ex, {0: [req("w0", doc0, max_tokens=1)], 1: [req("w1", doc1, max_tokens=1)]})
    run(sched, ex, {0: [req("x", list(range(900, 960)), max_tokens=1)]})
    sched.add_request(req("q0", doc0 + [5], max_tokens=1))
    sched.add_request(req("q1", doc1 + [5], max_tokens=1))
    plan = sched.schedule()
    assert [ld.request_id for ld in items_of(plan, HostLoad)] == ["q0"]
    assert tier.stats.short_hits_computed == 1  # q1's hit: 3 blocks on the host
    assert [sr.request_id for sr in plan.scheduled] == ["q0", "q1"]
    assert sched.admission_gate.stats.load_bound_steps == 0


@pytest.mark.parametrize("kv_policy", ["swap", "ellm"])
def test_other_memory_systems_under_the_host_tier_stay_exact(kv_policy):
    base_sched, _, base_ex = make(WritePolicy.WRITE_BACK, host_pages=0, kv_policy=kv_policy)
    base = run(base_sched, base_ex, docs_workload(seed=3, n=30))
    sched, tier, ex = make(WritePolicy.WRITE_BACK, kv_policy=kv_policy)
    arrivals = docs_workload(seed=3, n=30)
    assert run(sched, ex, arrivals) == base
    assert tier.stats.hit_blocks > 0


def _doc_then_a_waiter():
    """a reads doc, two fillers push it to the host, then b asks about doc while `long`
    decodes."""
    doc = list(range(100, 124))
    return {0: [req("a", doc, max_tokens=1)],
            4: [req("x", list(range(300, 328)), max_tokens=1)],
            8: [req("y", list(range(400, 428)), max_tokens=1)],
            12: [req("long", list(range(600, 606)), max_tokens=10)],
            14: [req("b", doc + [7, 8], max_tokens=3)]}


def _logged_item_kinds(ex) -> list[list[str]]:
    kinds: list[list[str]] = []
    orig = ex.execute

    def logging(plan):
        kinds.append(sorted({type(i).__name__ for i in plan.items}))
        return orig(plan)
    ex.execute = logging
    return kinds


def test_bubble_filling_prefetches_the_hit_of_a_request_that_waits_anyway():
    """b cannot be admitted while `long` runs (one sequence at a time): its host hit loads
    in a step's background meanwhile (no HostLoad for a forward to wait on), and when `long`
    finishes b hits its prefix on the device; outputs as without the host tier."""
    base_sched, _, base_ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=24, host_pages=0,
                                  max_num_seqs=1)
    base = run(base_sched, base_ex, _doc_then_a_waiter())
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=24, gate=True, prefetch=True,
                           max_num_seqs=1)
    kinds = _logged_item_kinds(ex)
    assert run(sched, ex, _doc_then_a_waiter()) == base
    assert sched.admission_gate.stats.prefetches == 1
    assert tier.stats.prefetched_blocks == 6 and tier.stats.hit_blocks == 0  # all of doc
    assert not any("HostLoad" in k for k in kinds)
    assert sched.kv.prefix_cache.stats.hits >= 6 * B  # b found its prefix on the device


def test_bubble_filling_never_evicts_the_hit_it_prefetches_beside():
    """The pool full, b's host block is prefetched by evicting other cached blocks, never
    b's own device hit: afterwards all of b's prefix is on the device."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=24, gate=True, prefetch=True)
    doc = list(range(100, 124))
    run(sched, ex, {0: [req("a", doc, max_tokens=1)]})
    run(sched, ex, {0: [req("x", list(range(300, 328)), max_tokens=1)]})
    b, cache = req("b", doc + [7, 8], max_tokens=1), sched.kv.prefix_cache
    hashes, n_device = cache.admission_hashes(b)
    n_host = tier.held_run(hashes[n_device:])
    assert n_device and n_host and sched.kv.gpu.num_free == 0
    sched.admission_gate.fill_bubbles([b], 32)
    sched.kv.take_cache_items()  # the plan's end: the prefetched blocks join the index
    assert cache.admission_hashes(b)[1] == n_device + n_host


DOC = list(range(100, 124))  # 6 token blocks


def _beside_a_hog(hog_tokens: int):
    """DOC on the host only (write-through, then evicted), and "hog" running with
    `hog_tokens` of prompt; b (DOC + 2 tokens) waits. (sched, tier, b)."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=24, gate=True, prefetch=True)
    run(sched, ex, {0: [req("a", DOC, max_tokens=1)]})
    run(sched, ex, {0: [req("x", list(range(300, 328)), max_tokens=1)]})  # DOC to the host
    sched.add_request(req("hog", list(range(600, 600 + hog_tokens)), max_tokens=20))
    for _ in range(2):
        plan = sched.schedule()
        sched.update(plan, ex.execute(plan))
    return sched, tier, req("b", DOC + [7, 8], max_tokens=1)


def test_a_prefetch_that_found_no_room_is_tried_again():
    """hog holds every device block, so b's first prefetch loads nothing; once hog is gone
    the next step's bubble filling loads b's whole host run."""
    sched, _, b = _beside_a_hog(47)
    kv, gate = sched.kv, sched.admission_gate
    assert kv.num_available_gpu_blocks() == 0
    gate.fill_bubbles([b], 32)
    assert gate.stats.prefetches == 0
    sched.finish_request("hog", RequestStatus.FINISHED_ABORTED)
    gate.fill_bubbles([b], 32)
    kv.take_cache_items()
    assert gate.stats.prefetches == 1 and kv.prefix_cache.admission_hashes(b)[1] == len(DOC) // B


def test_a_prefetch_loads_as_much_of_the_run_as_fits():
    """hog leaves one token block's room (2 device blocks): b's prefetch loads the first of
    its 6 host blocks, and its admission then hits it on the device."""
    sched, tier, b = _beside_a_hog(44)
    kv = sched.kv
    hashes = kv.prefix_cache.admission_hashes(b)[0]
    assert kv.num_available_gpu_blocks() == 2 and tier.held_run(hashes) == len(DOC) // B
    sched.admission_gate.fill_bubbles([b], 32)
    kv.take_cache_items()
    assert tier.stats.prefetched_blocks == 1 and kv.prefix_cache.admission_hashes(b)[1] == 1


def test_bubble_filling_never_holds_back_a_request_it_could_admit():
    """With room for b beside `long`, b is admitted at once and loads its hit inline (layer
    by layer behind its own prefill), not a step later from a prefetch."""
    sched, tier, ex = make(WritePolicy.WRITE_THROUGH, gpu_blocks=24, gate=True, prefetch=True)
    kinds = _logged_item_kinds(ex)
    run(sched, ex, _doc_then_a_waiter())
    assert sched.admission_gate.stats.prefetches == 0 and tier.stats.prefetched_blocks == 0
    assert tier.stats.hit_blocks == 6 and any("HostLoad" in k for k in kinds)
