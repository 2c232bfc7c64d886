"""Which API call's prompt enters the engine next: one prompt per call in turn.

The engine's waiting queue is first-come first-served per engine request. Were all prompts
of a call with hundreds of them added at once, a small call arriving a moment later would
wait for every one of them. So the worker keeps calls in this backlog and adds a prompt
(its `n` sequences) only while the engine has fewer than a batch of sequences waiting,
taking the calls round-robin: a later call waits behind at most one batch. Under the
priority policy the calls of the lowest priority value take their turns first (round-robin
among them), so an urgent call does not wait behind the backlog of others.
"""

from __future__ import annotations

from collections import Counter, OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kvtier.sampling_params import SamplingParams


@dataclass
class PendingCall:
    """The prompts of one API call that are not in the engine yet."""

    call_id: int
    params: SamplingParams
    arrival_time: float | None
    priority: int = 0
    prompts: deque[tuple[str, list[int]]] = field(default_factory=deque)  # (request_id, ids)
    request_ids: tuple[str, ...] = ()  # all of the call's, fed or not


@dataclass(frozen=True)
class FeedItem:
    call: PendingCall
    request_id: str
    prompt_ids: list[int]


class RoundRobinBacklog:
    """API calls waiting to enter the engine; `take` serves them one prompt each in turn
    (the lowest priority value first)."""

    def __init__(self) -> None:
        self._calls: OrderedDict[int, PendingCall] = OrderedDict()
        self._call_of: dict[str, int] = {}  # request_id -> call_id, for prompts not yet taken
        self._next_id = 0
        self._priorities: Counter[int] = Counter()  # priority -> calls waiting with it

    def add(
        self, prompts: Sequence[tuple[str, list[int]]], params: SamplingParams,
        arrival_time: float | None, priority: int = 0,
    ) -> PendingCall:
        call = PendingCall(self._next_id, params, arrival_time, priority, deque(prompts),
                           tuple(rid for rid, _ in prompts))
        self._next_id += 1
        if call.prompts:
            self._calls[call.call_id] = call
            self._priorities[priority] += 1
            for rid, _ in prompts:
                self._call_of[rid] = call.call_id
        return call

    def _next_call(self) -> tuple[int, PendingCall]:
        """The call whose turn it is: the first in turn of those of the lowest priority."""
        if len(self._priorities) == 1:  # one priority (always without the policy)
            return next(iter(self._calls.items()))
        best = min(self._priorities)
        return next((cid, c) for cid, c in self._calls.items() if c.priority == best)

    def _remove(self, call: PendingCall) -> None:
        del self._calls[call.call_id]
        self._priorities[call.priority] -= 1
        if not self._priorities[call.priority]:
            del self._priorities[call.priority]

    def take(self) -> FeedItem | None:
        """The next prompt of the call whose turn it is; that call then goes to the back."""
        if not self._calls:
            return None
        call_id, call = self._next_call()
        rid, ids = call.prompts.popleft()
        del self._call_of[rid]
        if call.prompts:
            self._calls.move_to_end(call_id)
        else:
            self._remove(call)
        return FeedItem(call, rid, ids)

    def discard(self, request_ids: Iterable[str]) -> None:
        """Drop prompts not taken yet (their call was aborted or failed)."""
        for rid in request_ids:
            call_id = self._call_of.pop(rid, None)
            if call_id is None:
                continue
            call = self._calls[call_id]
            call.prompts = deque(p for p in call.prompts if p[0] != rid)
            if not call.prompts:
                self._remove(call)

    def discard_call(self, call: PendingCall) -> None:
        self.discard(call.request_ids)

    def request_ids(self) -> list[str]:
        return list(self._call_of)

    def __len__(self) -> int:
        return len(self._call_of)
