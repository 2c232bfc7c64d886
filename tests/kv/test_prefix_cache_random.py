"""Random sequences of admissions (with hits, rolled back when they do not fit), chunked
prefill, decode, finish, abort and preempt-recompute over the prefix cache: every invariant
(check_integrity: ref counts, hash index, free list, LRU) holds after every operation, and
nothing leaks."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.core.request import Request, RequestStatus
from tests.kv.test_prefix_cache import B, finish, make_kv, preempt_recompute, req


class _Sim:
    """A scheduler in miniature over the KV manager: admission with hits (rolled back when
    the allocation fails), chunked prefill, decode, finish, abort, preempt-recompute."""

    def __init__(self, num_gpu_blocks: int, num_groups: int):
        self.kv = make_kv(num_gpu_blocks=num_gpu_blocks, num_groups=num_groups, algo="builtin")
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.n = 0

    def add(self, prefix: int, length: int, tail: int) -> None:
        tokens = [prefix * 7 + i % 5 for i in range(length)] + [100 + tail]
        self.waiting.append(req(f"r{self.n}", tokens, max_tokens=3))
        self.n += 1

    def admit(self) -> None:
        if not self.waiting:
            return
        r = self.waiting[0]
        r.num_computed_tokens = self.kv.admit(r)
        assert r.num_computed_tokens % B == 0 and r.num_computed_tokens < max(1, r.num_tokens)
        if self.kv.allocate_slots(r, min(6, r.num_tokens - r.num_computed_tokens)) is None:
            self.kv.free(r)  # roll back the hit
            r.num_computed_tokens = 0
            return
        self.waiting.pop(0)
        r.status = RequestStatus.RUNNING
        self.running.append(r)
        self._computed(r, min(6, r.num_tokens - r.num_computed_tokens))

    def _computed(self, r: Request, n: int) -> None:
        r.num_computed_tokens += n
        self.kv.cache_full_blocks(r, r.num_computed_tokens)
        if r.num_computed_tokens == r.num_tokens:
            r.append_token(200 + r.num_tokens % 3)
            if r.status.finished:
                self.running.remove(r)
                self.kv.free(r)

    def step(self, num_steps: int) -> None:
        """Every running request computes its next chunk, oldest first; the newest is
        preempted while one does not fit."""
        for _ in range(num_steps):
            self._step()

    def _step(self) -> None:
        for r in list(self.running):
            if r not in self.running:
                continue  # preempted for an older one
            n = min(6, r.num_tokens - r.num_computed_tokens)
            while self.kv.allocate_slots(r, n) is None:
                self.preempt(len(self.running) - 1)
                if r not in self.running:
                    break
            else:
                self._computed(r, n)

    def preempt(self, i: int) -> None:
        if self.running:
            r = self.running.pop(i % len(self.running))
            preempt_recompute(self.kv, r)
            self.waiting.insert(0, r)

    def abort(self, i: int) -> None:
        if self.running:
            r = self.running.pop(i % len(self.running))
            finish(self.kv, r, RequestStatus.FINISHED_ABORTED)


_add = st.tuples(st.just("add"), st.integers(0, 1), st.integers(0, 10), st.integers(0, 2))
_ops = st.one_of(_add, _add, st.tuples(st.just("admit")), st.tuples(st.just("admit")),
                 st.tuples(st.just("step"), st.integers(1, 8)),
                 st.tuples(st.just("step"), st.integers(1, 8)),
                 st.tuples(st.just("preempt"), st.integers(0, 7)),
                 st.tuples(st.just("abort"), st.integers(0, 7)))


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_ops, min_size=10, max_size=80), num_groups=st.integers(1, 2))
def test_random_operations_keep_the_cache_consistent(ops, num_groups):
    sim = _Sim(num_gpu_blocks=5 * num_groups, num_groups=num_groups)
    kv = sim.kv
    for op, *args in ops:
        getattr(sim, op)(*args)
        kv.check_integrity()
        assert all(kv.gpu.ref_count(b) >= 0 for b in range(kv.gpu.num_blocks))
    while sim.running:
        sim.abort(0)
    for r in sim.waiting:
        assert r.request_id not in kv.tables
    kv.reset_prefix_cache()
    assert kv.all_free()
    s = kv.prefix_cache.stats
    assert s.requests <= sim.n and s.hits <= s.queries
