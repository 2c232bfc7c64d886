"""Turn the engine's cumulative `RequestOutput`s into immutable deltas, on the worker thread.

The engine reports cumulative text and token ids per sequence. The server streams deltas,
and hands them from the worker thread to the event loop; computing them on the worker
means the event loop never reads a list the engine may still be appending to, and each
step copies only the new tokens (not the whole history, which would be quadratic).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from kvtier.engine.outputs import CompletionOutput, RequestMetrics, RequestOutput


@dataclass(frozen=True)
class SeqDelta:
    """What one sequence (one of the `n`) produced since its previous delta."""

    index: int
    text: str  # new text
    token_ids: tuple[int, ...]  # new token ids
    logprobs: tuple[dict[int, float], ...] | None  # one dict per new token, if requested
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    final_text: str | None = None  # the whole text, only in the delta that finishes it

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class RequestUpdate:
    request_id: str
    num_prompt_tokens: int
    seqs: tuple[SeqDelta, ...]
    finished: bool
    metrics: RequestMetrics | None = None  # a copy, only in the finishing update
    num_cached_tokens: int = 0  # prompt tokens the prefix cache supplied (RequestOutput's)
    # RequestOutput's, for requests that asked for them, until an update has carried them all
    prompt_logprobs: tuple[dict[int, float] | None, ...] | None = None


@dataclass
class _Cursor:
    holdback: int  # characters kept back while running (see `stop_holdback`)
    text: str = ""  # the text handed out so far
    num_tokens: int = 0
    finished: bool = False


def stop_holdback(stop: tuple[str, ...]) -> int:
    """How many trailing characters a running sequence must not stream yet.

    The engine cuts its text at a stop string once the string is complete, so the last
    `len(stop) - 1` characters may still be taken back; streaming them would make the
    streamed text differ from the final one. (A stop string starts no earlier than that.)
    """
    return max((len(s) for s in stop), default=1) - 1


@dataclass
class DeltaTracker:
    """Remembers, per live request and sequence, how much has been handed out already."""

    _cursors: dict[str, dict[int, _Cursor]] = field(default_factory=dict)
    _holdback: dict[str, int] = field(default_factory=dict)
    _prompt_sent: set[str] = field(default_factory=set)  # whole prompt logprobs handed out

    def track(self, request_id: str, holdback: int = 0) -> None:
        self._cursors[request_id] = {}
        self._holdback[request_id] = holdback

    def forget(self, request_id: str) -> None:
        self._cursors.pop(request_id, None)
        self._holdback.pop(request_id, None)
        self._prompt_sent.discard(request_id)

    def is_live(self, request_id: str) -> bool:
        return request_id in self._cursors

    def live_ids(self) -> list[str]:
        return list(self._cursors)

    def update(self, out: RequestOutput) -> RequestUpdate | None:
        """The delta of `out`; None for a request that is not tracked (already aborted)."""
        cursors = self._cursors.get(out.request_id)
        if cursors is None:
            return None
        seqs = []
        for comp in out.outputs:
            cur = cursors.get(comp.index)
            if cur is None:
                cur = cursors[comp.index] = _Cursor(self._holdback[out.request_id])
            delta = _seq_delta(comp, cur)
            if delta is not None:
                seqs.append(delta)
        prompt_lps = None
        if out.prompt_logprobs is not None and out.request_id not in self._prompt_sent:
            prompt_lps = tuple(out.prompt_logprobs)
            if all(d is not None for d in prompt_lps[1:]):
                self._prompt_sent.add(out.request_id)
        metrics = None
        if out.finished:
            self.forget(out.request_id)
            if out.metrics is not None:
                metrics = dataclasses.replace(out.metrics, token_times=list(out.metrics.token_times))
        return RequestUpdate(
            request_id=out.request_id,
            num_prompt_tokens=len(out.prompt_token_ids),
            seqs=tuple(seqs),
            finished=out.finished,
            metrics=metrics,
            num_cached_tokens=out.num_cached_tokens or 0,
            prompt_logprobs=prompt_lps,
        )


def _seq_delta(comp: CompletionOutput, cur: _Cursor) -> SeqDelta | None:
    if cur.finished:
        return None  # a finished sibling keeps appearing in cumulative outputs
    new_ids = tuple(comp.token_ids[cur.num_tokens :])
    text = comp.text
    sendable = text if comp.finished else text[: max(len(cur.text), len(text) - cur.holdback)]
    # Sent text is never taken back (holdback); should an engine do it anyway, send
    # nothing until its text extends what was sent again.
    new_text = sendable[len(cur.text) :] if sendable.startswith(cur.text) else ""
    logprobs = None
    if comp.logprobs is not None:
        logprobs = tuple(dict(d) for d in comp.logprobs[cur.num_tokens :])
    if not new_ids and not new_text and not comp.finished:
        return None
    cur.num_tokens += len(new_ids)
    if new_text:
        cur.text = sendable
    cur.finished = comp.finished
    return SeqDelta(
        index=comp.index,
        text=new_text,
        token_ids=new_ids,
        logprobs=logprobs,
        finish_reason=comp.finish_reason,
        stop_reason=comp.stop_reason,
        final_text=text if comp.finished else None,
    )
