"""Waiting queues: the order in which waiting requests are offered admission.

  fcfs  arrival order (vLLM's scheduler);
  priority  vLLM's `--scheduling-policy priority`: the lowest `priority` value first, then
        arrival; a preempted request goes back to its place (its own priority and arrival),
        and the running request preempted when blocks run out is the one of the highest
        value (the newest among equals) instead of the newest;
  lpm   SGLang's longest prefix match (`--schedule-policy lpm`): before a step's admissions
        the requests are ordered by how many of their leading token blocks the prefix
        cache holds, in either tier, the longest first (arrival order among equals), so
        that requests whose prefix is cached run while it is, before it is evicted by
        the others' misses. As SGLang does, a queue longer than LPM_MAX_WAITING is taken in
        arrival order (the look-ups would cost more than they win), and without a prefix
        cache the order is arrival order.

In fcfs and lpm a preempted request goes first (it arrived before everything still waiting),
and the newest running request is preempted first.
"""

from __future__ import annotations

import bisect
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

    def victim_index(self, running: list[Request]) -> int:
        """Which running request is preempted when blocks run out: the newest (it has the
        least work to lose)."""
        return len(running) - 1

    def precedes(self, req: Request, other: Request) -> bool:
        """Whether waiting `req` goes before swapped-out `other`: never here (a swapped
        request arrived before every waiting one, vLLM V0's rule); by priority in the
        priority queue."""
        return False

    def resume_order(self, swapped: deque[Request]) -> deque[Request]:
        """The order swapped-out requests come back in: as they are (the last preempted
        first: it ran before the others)."""
        return swapped

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


class PriorityQueue(FCFSQueue):
    """Waiting requests by (priority, arrival), in a list sorted the other way round: the
    head is its end, so a pop is O(1) and an add one binary search and one move of the
    references behind it (LLM.generate adds every prompt at once)."""

    def __init__(self) -> None:
        super().__init__()
        self._rev: list[Request] = []  # the queue, last first
        self._rank: dict[str, int] = {}  # request id -> rank of its add (ties of arrival)
        self._ranks = itertools.count()

    def _rev_key(self, req: Request) -> tuple[int, float, int]:
        priority, arrival = priority_order(req)
        return -priority, -arrival, -self._rank[req.request_id]

    def add(self, req: Request) -> None:
        self._rank[req.request_id] = next(self._ranks)
        bisect.insort(self._rev, req, key=self._rev_key)

    def prepend(self, req: Request) -> None:
        self.add(req)  # back to its own place: priority decides, not the preemption

    def peek(self) -> Request:
        return self._rev[-1]

    def pop(self) -> Request:
        req = self._rev.pop()
        del self._rank[req.request_id]  # a preempted request comes back by its arrival time
        return req

    def remove(self, req: Request) -> None:
        self._rev.remove(req)
        del self._rank[req.request_id]

    def __len__(self) -> int:
        return len(self._rev)

    def __iter__(self) -> Iterator[Request]:
        return reversed(self._rev)

    def precedes(self, req: Request, other: Request) -> bool:
        return priority_order(req) < priority_order(other)

    def resume_order(self, swapped: deque[Request]) -> deque[Request]:
        return deque(sorted(swapped, key=priority_order))

    def victim_index(self, running: list[Request]) -> int:
        """The running request of the highest (priority, arrival), the newest among equals."""
        return max(range(len(running)), key=lambda i: (*priority_order(running[i]), i))


def priority_order(req: Request) -> tuple[int, float]:
    """The priority policy's order: the lower value first, then the earlier arrival."""
    return req.priority, req.arrival_time


def cached_blocks(cache: PrefixCache, req: Request) -> int:
    """Leading token blocks of a waiting request the cache holds, in either tier (a look-up
    that changes nothing but the request's hash cache)."""
    hashes, n = cache.admission_hashes(req)
    return n + (cache.lower.held_run(hashes[n:]) if cache.lower is not None else 0)


def make_queue(policy: str) -> FCFSQueue:
    """The queue of a SchedulerConfig.schedule_policy (checked there)."""
    if policy == "priority":
        return PriorityQueue()
    return LongestPrefixQueue() if policy == "lpm" else FCFSQueue()
