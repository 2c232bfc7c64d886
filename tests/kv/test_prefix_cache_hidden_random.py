"""Random admissions with hits, chunked prefill, decode, HCache preemptions (hide) and resumes
(taking the cached prefix back, re-projecting or recomputing the rest), evictions of what
hidden requests left cached, aborts and finishes
over the prefix cache: every invariant holds after every operation (check_integrity: ref
counts, hash index, LRU, hidden-state coverage), a resumed request's hidden states cover
what the runner re-projects, and nothing leaks."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.config import SystemOptions
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.policies.hcache import HCachePolicy, HiddenStore
from tests.kv.test_prefix_cache import B, req

CHUNK = 6


class _Sim:
    def __init__(self, num_gpu_blocks: int, num_hidden_blocks: int):
        self.kv = KVCacheManager(num_groups=1, block_size=B, num_gpu_blocks=num_gpu_blocks,
                                 num_host_blocks=0, watermark=0.0,
                                 hidden_store=HiddenStore(num_hidden_blocks, B),
                                 prefix_cache=PrefixCacheConfig(hash_algo="builtin"))
        self.policy = HCachePolicy(SystemOptions())
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.swapped: list[Request] = []
        self.n = 0

    def add(self, prefix: int, length: int) -> None:
        tokens = [prefix * 7 + i % 5 for i in range(length)] + [100 + self.n]
        self.waiting.append(req(f"r{self.n}", tokens, max_tokens=3))
        self.n += 1

    def _computed(self, r: Request, start: int, n: int) -> None:
        """The scheduler's _make_plan for one entry, then the step's token."""
        r.num_computed_tokens = start + n
        self.kv.cache_full_blocks(r, r.num_computed_tokens)
        self.kv.hidden.extend(r.request_id, r.num_computed_tokens, start)
        if r.num_computed_tokens == r.num_tokens:
            r.append_token(200 + r.num_tokens % 3)
            if r.status.finished:
                self.running.remove(r)
                self.kv.free(r)

    def admit(self) -> None:
        if not self.waiting:
            return
        r = self.waiting[0]
        start = r.num_computed_tokens = self.kv.admit(r)
        n = min(CHUNK, r.num_tokens - start)
        if self.kv.allocate_slots(r, n) is None:
            self.kv.free(r)
            r.num_computed_tokens = 0
            return
        self.waiting.pop(0)
        r.status = RequestStatus.RUNNING
        self.running.append(r)
        self._computed(r, start, n)

    def resume(self) -> None:
        if not self.swapped:
            return
        r = self.swapped[0]
        n = min(CHUNK, r.num_tokens - r.num_computed_tokens)
        if not self.policy.can_resume(r, self.kv, n):
            return
        work = self.policy.resume(r, self.kv)
        if work.restore_tokens:  # the runner re-projects exactly these from hidden states
            rid = r.request_id
            assert self.kv.hidden.first_token(rid) <= work.restore_from
            assert self.kv.hidden.covers(rid, work.restore_from + work.restore_tokens)
        assert self.kv.allocate_slots(r, n) is not None, "can_resume promised room"
        self.swapped.pop(0)
        r.status = RequestStatus.RUNNING
        self.running.append(r)
        self._computed(r, r.num_computed_tokens, n)

    def step(self) -> None:
        for r in list(self.running):
            if r not in self.running:
                continue
            n = min(CHUNK, r.num_tokens - r.num_computed_tokens)
            while self.kv.allocate_slots(r, n) is None:
                self.preempt(len(self.running) - 1)
                if r not in self.running:
                    break
            else:
                self._computed(r, r.num_computed_tokens, n)

    def preempt(self, i: int) -> None:
        if not self.running:
            return
        r = self.running.pop(i % len(self.running))
        r.num_preemptions += 1
        if self.policy.preempt(r, self.kv).resumable:
            self.swapped.insert(0, r)
        else:
            self.waiting.insert(0, r)

    def flood(self) -> None:
        """A request of new tokens takes every free and evictable block, then aborts: what
        a hidden request left cached is evicted (it recomputes what its hit loses)."""
        n = self.kv.gpu.num_free + self.kv.prefix_cache.num_evictable_device_blocks()
        if n:
            r = req(f"flood{self.n}", range(1000 + 100 * self.n, 1000 + 100 * self.n + n * B))
            self.n += 1
            assert self.kv.allocate_slots(r, n * B) is not None
            r.status = RequestStatus.FINISHED_ABORTED
            self.kv.free(r)

    def abort(self, i: int) -> None:
        queue = self.running or self.swapped
        if queue:
            r = queue.pop(i % len(queue))
            r.status = RequestStatus.FINISHED_ABORTED
            self.kv.free(r)


_add = st.tuples(st.just("add"), st.integers(0, 3), st.integers(0, 20))
_ops = st.one_of(
    _add, _add,
    *[st.tuples(st.just(op)) for op in ("admit", "admit", "resume", "resume", "step", "step",
                                        "flood")],
    st.tuples(st.just("preempt"), st.integers(0, 7)),
    st.tuples(st.just("abort"), st.integers(0, 7)))


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(_ops, min_size=20, max_size=120), num_hidden_blocks=st.integers(2, 16))
def test_random_hides_and_resumes_keep_the_cache_consistent(ops, num_hidden_blocks):
    sim = _Sim(num_gpu_blocks=10, num_hidden_blocks=num_hidden_blocks)
    kv = sim.kv
    for op, *args in ops:
        getattr(sim, op)(*args)
        kv.check_integrity()
    while sim.running or sim.swapped:
        sim.abort(0)
    for r in sim.waiting:
        assert r.request_id not in kv.tables and r.request_id not in kv.hidden.ids
    kv.reset_prefix_cache()
    assert kv.all_free()
