"""The engine's step loop in one background thread; asyncio streams of its outputs.

    event loop (HTTP handlers)                worker thread (owns the engine)
    ──────────────────────────                ───────────────────────────────
    submit() ──► _Add ──► command queue ──►   backlog ─(round-robin, a batch ahead)─► add_request
    stream.close() ──► _Abort ─────────────►  abort_request / drop from the backlog
    RequestStream.queue ◄── call_soon_threadsafe(_deliver, updates) ◄── step() → deltas

The engine is not thread-safe, so only the worker touches it: every other access is a
command that the worker applies between two steps. Commands are applied before each step,
so an abort frees the request's blocks before the next step runs.

A step that raises ends the requests it was computing (RequestFailedError); the others go
on. `MAX_CONSECUTIVE_STEP_FAILURES` failing steps in a row stop the loop (EngineDeadError).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from kvtier.engine.outputs import EngineStats
from kvtier.sampling_params import SamplingParams
from kvtier.server.admission import FeedItem, PendingCall, RoundRobinBacklog
from kvtier.server.commands import Abort, Add, Call, Stop, fail_future, run_into
from kvtier.server.streams import (
    EngineDeadError,
    RequestFailedError,
    RequestStream,
    RequestTimeoutError,
    ServerOverloadedError,
    ShuttingDownError,
)
from kvtier.server.updates import DeltaTracker, RequestUpdate, stop_holdback

__all__ = ["AsyncEngine", "EngineDeadError", "RequestFailedError", "RequestStream",
           "RequestTimeoutError", "ServerOverloadedError", "ShuttingDownError"]

logger = logging.getLogger(__name__)
T = TypeVar("T")
MAX_CONSECUTIVE_STEP_FAILURES = 3


# ----------------------------------------------------------------------------- engine
class AsyncEngine:
    """Runs `engine.step()` in a worker thread and serves asyncio callers.

    `max_waiting_requests` bounds the sequences (prompts x n) accepted but not yet
    producing tokens; `submit` beyond it raises ServerOverloadedError instead of queueing
    without limit. `feed_window` is how many sequences may wait inside the engine (default:
    its max_num_seqs); the rest wait in the round-robin backlog (see admission.py).
    `on_update(update)` is called on the worker thread for every update (metrics).
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_waiting_requests: int = 256,
        feed_window: int | None = None,
        on_update: Callable[[RequestUpdate], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self.feed_window = feed_window or engine.config.scheduler.max_num_seqs
        self._on_update = on_update
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "enqueue" against "worker died/stopped"
        self._closed: BaseException | None = None  # set once the worker no longer runs
        self._tracker = DeltaTracker()
        self._backlog = RoundRobinBacklog()  # worker thread only
        self._num_step_failures = 0  # consecutive; worker only
        self._num_engine_waiting = 0  # sequences waiting in the engine (last step + fed since)
        self._streams: dict[str, RequestStream] = {}  # loop thread only
        self._pending: dict[str, int] = {}  # accepted, no token yet -> its n; loop only
        self._num_pending_seqs = 0
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats: EngineStats | None = None  # the latest snapshot, written by the worker

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the worker; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        self._publish_stats()
        self._thread = threading.Thread(target=self._run, name="kvtier-engine", daemon=True)
        self._thread.start()

    def stop_accepting(self) -> None:
        self._accepting = False

    async def drain(self, timeout_s: float) -> None:
        """Stop accepting; let in-flight requests finish for `timeout_s`, then end the rest
        with ShuttingDownError (their clients get a 503 body or an SSE error event)."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._streams and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for stream in set(self._streams.values()):
            stream.fail(ShuttingDownError("the server is shutting down"))
            stream.close()

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """`drain(timeout_s)`, then stop the worker."""
        await self.drain(timeout_s)
        self._enqueue(Stop())
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 30.0)

    def now(self) -> float:
        """The engine's clock (time.monotonic for a real engine), for arrival times."""
        clock = getattr(self.engine, "clock", None)
        return clock() if callable(clock) else time.monotonic()

    @property
    def is_healthy(self) -> bool:
        return self._closed is None and self._thread is not None and self._thread.is_alive()

    @property
    def is_accepting(self) -> bool:
        return self._accepting

    @property
    def num_pending(self) -> int:
        """Sequences accepted that have not produced a token yet (the waiting bound)."""
        return self._num_pending_seqs

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ requests (loop)
    async def submit(
        self,
        prompts: Sequence[tuple[str, list[int]]],
        params: SamplingParams,
        arrival_time: float | None = None, priority: int = 0,
    ) -> RequestStream:
        """Accept one engine request per (request_id, prompt ids), each with `params.n`
        sequences; those the engine takes at once are all-or-none (InvalidRequestError).

        `arrival_time` (from `now()`, taken when the HTTP request came in) makes the engine's
        TTFT and E2E include tokenization and the wait for the worker.
        Raises InvalidRequestError (from the engine), ServerOverloadedError,
        ShuttingDownError or EngineDeadError.
        """
        self.check_admission(len(prompts) * params.n)
        ids = [rid for rid, _ in prompts]
        stream = RequestStream(ids, self)
        for rid in ids:
            self._streams[rid] = stream
            self._pending[rid] = params.n
        self._num_pending_seqs += len(ids) * params.n
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(Add(prompts, params, future, arrival_time, priority), future)
        try:
            await asyncio.wrap_future(future)
        except BaseException:
            stream.close()  # also on cancellation: the add may still run, then gets aborted
            raise
        return stream

    def abort(self, request_ids: Iterable[str]) -> int:
        """Abort on the worker; return how many were still in flight (not yet finished)."""
        ids = list(request_ids)
        num_in_flight = 0
        for rid in ids:
            num_in_flight += self._streams.pop(rid, None) is not None
            self._num_pending_seqs -= self._pending.pop(rid, 0)
        if ids:
            self._enqueue(Abort(ids))
        return num_in_flight

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(engine)` on the worker between two steps; return its result."""
        return await asyncio.wrap_future(self.call_threadsafe(fn))

    def call_threadsafe(self, fn: Callable[[Any], T]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(Call(fn, future), future)
        return future

    def check_admission(self, num_new_seqs: int, num_reserved_seqs: int = 0) -> None:
        """Whether `num_new_seqs` more sequences may wait now, beside `num_reserved_seqs`
        admitted but not submitted yet; cheap, so handlers call it before tokenizing too.
        Raises ShuttingDownError, EngineDeadError, ServerOverloadedError."""
        if not self._accepting:
            raise ShuttingDownError("the server is shutting down")
        if self._closed is not None:
            raise self._closed_error()
        num_waiting = self._num_pending_seqs + num_reserved_seqs
        if num_waiting + num_new_seqs > self.max_waiting_requests:
            raise ServerOverloadedError(f"the server is overloaded: {num_waiting} sequences "
                                        f"are waiting (limit {self.max_waiting_requests}); retry later")

    def _enqueue(self, cmd: Any, future: concurrent.futures.Future | None = None) -> None:
        with self._lock:
            if self._closed is None:
                self._commands.put(cmd)
                return
        if future is not None:
            fail_future(future, self._closed_error())

    def _closed_error(self) -> BaseException:
        """A fresh exception like the one that closed the worker (stopped or died)."""
        closed = self._closed
        if isinstance(closed, ShuttingDownError):
            return ShuttingDownError(str(closed))
        return EngineDeadError(str(closed) if closed is not None else "the engine is not running")

    def _deliver(self, updates: list[RequestUpdate]) -> None:
        for update in updates:
            self._num_pending_seqs -= self._pending.pop(update.request_id, 0)
            stream = self._streams.get(update.request_id)
            if stream is None:
                continue  # aborted after the step produced it
            if update.finished:
                del self._streams[update.request_id]
            stream.put(update)

    def _deliver_failure(self, request_ids: list[str], exc: BaseException) -> None:
        """End the streams of `request_ids` with `exc` (their engine requests are gone)."""
        for stream in {s for rid in request_ids if (s := self._streams.get(rid)) is not None}:
            stream.fail(type(exc)(str(exc)))
            stream.close()  # aborts the stream's other prompts too

    def _fail_all(self, exc: BaseException) -> None:
        for stream in set(self._streams.values()):
            stream.fail(type(exc)(str(exc)))  # one instance each: tracebacks are per raise
        self._streams.clear()
        self._pending.clear()
        self._num_pending_seqs = 0

    # ------------------------------------------------------------------ worker thread
    def _run(self) -> None:
        try:
            while self._serve_once():
                pass
        except BaseException as exc:  # the step loop is broken: fail everyone, stay dead
            logger.exception("engine step loop failed")
            self._close(EngineDeadError(f"engine failed: {exc!r}"))
        else:
            self._close(ShuttingDownError("the engine was stopped"))

    def _serve_once(self) -> bool:
        """Apply queued commands, feed the engine, run a step if there is work; False: stop."""
        busy = self.engine.has_unfinished_requests() or len(self._backlog) > 0
        commands = [self._commands.get()] if not busy else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for cmd in commands:
            if isinstance(cmd, Stop):
                self._backlog.discard(self._backlog.request_ids())
                self._abort_ids(self._tracker.live_ids())
                return False
            self._apply(cmd)
        self._feed()
        updates = self._guarded_step() if self.engine.has_unfinished_requests() else []
        self._publish_stats()
        if updates:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._deliver, updates)
        return True

    def _publish_stats(self) -> None:
        """The engine's stats, its waiting requests counted with the backlog's (they wait
        too: /metrics and the stats line count every waiting request, as vLLM's do)."""
        stats = self.engine.get_stats()
        self._num_engine_waiting = stats.num_waiting
        self.stats = replace(stats, num_waiting=stats.num_waiting + len(self._backlog))

    def _guarded_step(self) -> list[RequestUpdate]:
        try:
            updates = self._step()
        except Exception as exc:
            self._num_step_failures += 1
            if self._num_step_failures >= MAX_CONSECUTIVE_STEP_FAILURES:
                raise
            logger.exception("engine step failed; ending the requests it computed")
            suspects = self._step_request_ids()
            self._abort_ids(suspects)
            self._fail_requests(suspects, RequestFailedError(f"the engine failed on this request: {exc!r}"))
            return []
        self._num_step_failures = 0
        return updates

    def _step(self) -> list[RequestUpdate]:
        updates = []
        for out in self.engine.step():
            update = self._tracker.update(out)
            if update is None:
                continue
            updates.append(update)
            if self._on_update is not None:
                self._on_update(update)
        return updates

    def _step_request_ids(self) -> list[str]:
        """The live requests the failed step was computing: the engine's running ones (or,
        for an engine that does not say, all live ones)."""
        live = self._tracker.live_ids()
        running = getattr(getattr(self.engine, "scheduler", None), "running", None)
        if not running:
            return live
        # An engine request with n > 1 runs as children "<request_id>#<i>".
        ids = {r.request_id for r in running}
        ids |= {rid.rsplit("#", 1)[0] for rid in ids}
        return [rid for rid in live if rid in ids] or live

    def _apply(self, cmd: Any) -> None:
        if isinstance(cmd, Add):
            self._add(cmd)
        elif isinstance(cmd, Abort):
            self._backlog.discard(cmd.request_ids)
            self._abort_ids(cmd.request_ids)
        elif isinstance(cmd, Call):
            run_into(cmd.future, cmd.fn, self.engine)

    def _add(self, cmd: Add) -> None:
        """Queue the call in the backlog and feed at once: what enters the engine now is
        validated now, all or none."""
        if not cmd.future.set_running_or_notify_cancel():
            return  # the caller gave up before we got here
        call = self._backlog.add(cmd.prompts, cmd.params, cmd.arrival_time, cmd.priority)
        try:
            self._feed(submitting=call)
        except Exception as exc:  # InvalidRequestError mostly
            self._drop_call(call)
            cmd.future.set_exception(exc)
            return
        cmd.future.set_result(None)

    def _feed(self, submitting: PendingCall | None = None) -> None:
        """Add prompts from the backlog, round-robin, while fewer than `feed_window`
        sequences wait in the engine. A prompt the engine refuses ends its whole call;
        for the call being submitted the error is raised to `submit` instead."""
        while len(self._backlog) and self._num_engine_waiting < self.feed_window:
            item = self._backlog.take()
            assert item is not None
            try:
                self._add_one(item)
            except Exception as exc:
                if item.call is submitting:
                    raise
                self._drop_call(item.call)
                self._fail_requests(list(item.call.request_ids), exc)
            self._num_engine_waiting += item.call.params.n

    def _add_one(self, item: FeedItem) -> None:
        call = item.call
        self.engine.add_request(item.request_id, item.prompt_ids, call.params, call.arrival_time,
                                call.priority)
        self._tracker.track(item.request_id, stop_holdback(call.params.stop))

    def _drop_call(self, call: PendingCall) -> None:
        self._backlog.discard_call(call)
        self._abort_ids(call.request_ids)

    def _fail_requests(self, request_ids: list[str], exc: BaseException) -> None:
        if request_ids and self._loop is not None:
            self._loop.call_soon_threadsafe(self._deliver_failure, request_ids, exc)

    def _abort_ids(self, request_ids: Iterable[str]) -> None:
        # Only ids the engine still runs: finished ones are gone from the engine already.
        live = [rid for rid in request_ids if self._tracker.is_live(rid)]
        if live:
            self.engine.abort_request(live)
            for rid in live:
                self._tracker.forget(rid)

    def _close(self, exc: BaseException) -> None:
        with self._lock:
            self._closed = exc
        while True:  # fail whatever was queued after the last command we applied
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                break
            future = getattr(cmd, "future", None)
            if future is not None:
                fail_future(future, exc)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._fail_all, exc)
            except RuntimeError:  # the loop closed meanwhile
                pass

