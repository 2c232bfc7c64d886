"""Waiting queues: the order in which waiting requests are offered admission.

  fcfs  arrival order (vLLM's scheduler);
  lpm   SGLang's longest prefix match (`--schedule-policy lpm`): before a step's admissions
        the requests are ordered by how many of their leading token blocks the prefix
        cache holds, in either tier, the longest first (arrival order among equals), so
        that requests whose prefix is cached run while it is, before it is evicted by
        the others' misses. As SGLang does, a queue longer than LPM_MAX_WAITING is taken in
        arrival order (the look-ups would cost more than they win), and without a prefix
        cache the order is arrival order.

In both, a preempted request goes first (it arrived before everything still waiting).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvtier.core.request import Request

if TYPE_CHECKING:
    from kvtier.kv.prefix_cache import PrefixCache

LPM_MAX_WAITING = 128  # SGLang's cut-off for its prefix-match ordering


class FCFSQueue:
    def __init__(self) -> None:
        self._q: deque[Request] = deque()

    def add(self, req: Request) -> None:
        self._q.append(req)

    def prepend(self, req: Request) -> None:
        """Preempted requests go first: they arrived before everything still waiting."""
        self._q.appendleft(req)

    def peek(self) -> Request:
        return self._q[0]

    def pop(self) -> Request:
        return self._q.popleft()

    def remove(self, req: Request) -> None:
        self._q.remove(req)

    def reorder(self, cache: PrefixCache | None) -> None:
        """Before a step's admissions (arrival order: nothing to do)."""
        return None

    def __len__(self) -> int:
        return len(self._q)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._q)


class LongestPrefixQueue(FCFSQueue):
    def __init__(self) -> None:
        super().__init__()
        self._arrival: dict[str, int] = {}  # request id -> arrival rank
        self._preempted: set[str] = set()
        self._ranks = itertools.count()

    def add(self, req: Request) -> None:
        self._arrival[req.request_id] = next(self._ranks)
        super().add(req)

    def prepend(self, req: Request) -> None:
        self._preempted.add(req.request_id)
        super().prepend(req)

    def pop(self) -> Request:
        req = super().pop()
        self._forget(req)
        return req

    def remove(self, req: Request) -> None:
        super().remove(req)
        self._forget(req)

    def _forget(self, req: Request) -> None:
        self._preempted.discard(req.request_id)
        self._arrival.pop(req.request_id, None)

    def reorder(self, cache: PrefixCache | None) -> None:
        q = self._q
        if cache is None or len(q) < 2 or len(q) > LPM_MAX_WAITING:
            return
        first = [r for r in q if r.request_id in self._preempted]
        rest = [r for r in q if r.request_id not in self._preempted]
        rest.sort(key=lambda r: (-cached_blocks(cache, r), self._arrival[r.request_id]))
        self._q = deque(first + rest)


def cached_blocks(cache: PrefixCache, req: Request) -> int:
    """Leading token blocks of a waiting request the cache holds, in either tier (a look-up
    that changes nothing but the request's hash cache)."""
    hashes, n = cache.admission_hashes(req)
    return n + (cache.lower.held_run(hashes[n:]) if cache.lower is not None else 0)


def make_queue(policy: str) -> FCFSQueue:
    """The queue of a SchedulerConfig.schedule_policy (checked there)."""
    return LongestPrefixQueue() if policy == "lpm" else FCFSQueue()
