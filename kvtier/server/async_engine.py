"""The engine's step loop in one background thread; asyncio streams of its outputs.

    event loop (HTTP handlers)                worker thread (owns the engine)
    ──────────────────────────                ───────────────────────────────
    submit() ──► _Add ──► command queue ──►   add_request / abort_request / call
    stream.close() ──► _Abort ─────────────►  step() → deltas
    RequestStream.queue ◄── call_soon_threadsafe(_deliver, updates) ◄──┘

The engine is not thread-safe, so only the worker touches it: every other access is a
command that the worker applies between two steps. Commands are applied before each step,
so an abort frees the request's blocks before the next step runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kvtier.engine.outputs import EngineStats
from kvtier.sampling_params import SamplingParams
from kvtier.server.updates import DeltaTracker, RequestUpdate, stop_holdback

logger = logging.getLogger(__name__)
T = TypeVar("T")


class ServerOverloadedError(RuntimeError):
    """The waiting queue is full; the client should retry later (HTTP 503)."""


class ShuttingDownError(RuntimeError):
    """The server no longer accepts requests (HTTP 503)."""


class EngineDeadError(RuntimeError):
    """The engine's step loop failed; nothing more can be served (HTTP 503)."""


# ----------------------------------------------------------------------------- commands
@dataclass
class _Add:
    prompts: Sequence[tuple[str, list[int]]]  # (request_id, prompt token ids)
    params: SamplingParams
    future: concurrent.futures.Future
    arrival_time: float | None = None  # on the engine's clock


@dataclass
class _Abort:
    request_ids: list[str]


@dataclass
class _Call:
    fn: Callable[[Any], Any]
    future: concurrent.futures.Future


@dataclass
class _Stop:
    pass


# ----------------------------------------------------------------------------- streams
class RequestStream:
    """The updates of the engine requests of one API call (one per prompt), on the loop."""

    def __init__(self, request_ids: Sequence[str], owner: AsyncEngine) -> None:
        self.request_ids = tuple(request_ids)
        self._unfinished = set(request_ids)
        self._queue: asyncio.Queue[RequestUpdate | None] = asyncio.Queue()
        self._failure: BaseException | None = None
        self._owner = owner

    @property
    def finished(self) -> bool:
        return not self._unfinished

    def put(self, update: RequestUpdate) -> None:
        self._queue.put_nowait(update)

    def fail(self, exc: BaseException) -> None:
        """End the stream with `exc` (engine died, shutdown), raised to its consumer."""
        self._failure = exc
        self._queue.put_nowait(None)  # wakes a consumer waiting in __aiter__

    async def __aiter__(self) -> AsyncIterator[RequestUpdate]:
        while True:
            # Checked before `_unfinished`: a failed stream must never look complete.
            if self._failure is not None:
                raise self._failure
            if not self._unfinished:
                return
            update = await self._queue.get()
            if update is None:
                continue
            if update.finished:
                self._unfinished.discard(update.request_id)
            yield update

    def close(self) -> int:
        """Abort whatever is unfinished (client gone, error); return how many. Idempotent."""
        if not self._unfinished:
            return 0
        num = self._owner.abort(self._unfinished)
        self._unfinished.clear()
        return num


# ----------------------------------------------------------------------------- engine
class AsyncEngine:
    """Runs `engine.step()` in a worker thread and serves asyncio callers.

    `max_waiting_requests` bounds the requests accepted but not yet producing tokens;
    `submit` beyond it raises ServerOverloadedError instead of queueing without limit.
    `on_update(update)` is called on the worker thread for every update (metrics).
    """

    def __init__(
        self,
        engine: Any,
        *,
        max_waiting_requests: int = 256,
        on_update: Callable[[RequestUpdate], None] | None = None,
    ) -> None:
        self.engine = engine
        self.max_waiting_requests = max_waiting_requests
        self._on_update = on_update
        self._commands: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()  # orders "enqueue" against "worker died/stopped"
        self._closed: BaseException | None = None  # set once the worker no longer runs
        self._tracker = DeltaTracker()
        self._streams: dict[str, RequestStream] = {}  # loop thread only
        self._pending: set[str] = set()  # accepted, no token yet; loop thread only
        self._accepting = True
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats: EngineStats | None = None  # the latest snapshot, written by the worker

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Start the worker; call from the event loop that will consume the streams."""
        self._loop = asyncio.get_running_loop()
        self.stats = self.engine.get_stats()
        self._thread = threading.Thread(target=self._run, name="kvtier-engine", daemon=True)
        self._thread.start()

    async def shutdown(self, timeout_s: float = 30.0) -> None:
        """Stop accepting, let in-flight requests finish for `timeout_s`, abort the rest."""
        self._accepting = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._streams and loop.time() < deadline:
            await asyncio.sleep(0.02)
        for stream in set(self._streams.values()):
            stream.fail(ShuttingDownError("the server is shutting down"))
            stream.close()
        self._enqueue(_Stop())
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
    def num_pending(self) -> int:
        """Requests accepted that have not produced a token yet (the waiting bound)."""
        return len(self._pending)

    @property
    def num_in_flight(self) -> int:
        return len(self._streams)

    # ------------------------------------------------------------------ requests (loop)
    async def submit(
        self,
        prompts: Sequence[tuple[str, list[int]]],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> RequestStream:
        """Add one engine request per (request_id, prompt ids); all or none are added.

        `arrival_time` (from `now()`, taken when the HTTP request came in) makes the engine's
        TTFT and E2E include tokenization and the wait for the worker.
        Raises InvalidRequestError (from the engine), ServerOverloadedError,
        ShuttingDownError or EngineDeadError.
        """
        self._check_admission(len(prompts))
        ids = [rid for rid, _ in prompts]
        stream = RequestStream(ids, self)
        for rid in ids:
            self._streams[rid] = stream
            self._pending.add(rid)
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(_Add(prompts, params, future, arrival_time), future)
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
            self._pending.discard(rid)
        if ids:
            self._enqueue(_Abort(ids))
        return num_in_flight

    async def call(self, fn: Callable[[Any], T]) -> T:
        """Run `fn(engine)` on the worker between two steps; return its result."""
        return await asyncio.wrap_future(self.call_threadsafe(fn))

    def call_threadsafe(self, fn: Callable[[Any], T]) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._enqueue(_Call(fn, future), future)
        return future

    def _check_admission(self, num_new: int) -> None:
        if not self._accepting:
            raise ShuttingDownError("the server is shutting down")
        if self._closed is not None:
            raise self._closed_error()
        if len(self._pending) + num_new > self.max_waiting_requests:
            raise ServerOverloadedError(
                f"the server is overloaded: {len(self._pending)} requests are waiting "
                f"(limit {self.max_waiting_requests}); retry later"
            )

    def _enqueue(self, cmd: Any, future: concurrent.futures.Future | None = None) -> None:
        with self._lock:
            if self._closed is None:
                self._commands.put(cmd)
                return
        if future is not None:
            _fail(future, self._closed_error())

    def _closed_error(self) -> BaseException:
        """A fresh exception like the one that closed the worker (stopped or died)."""
        closed = self._closed
        if isinstance(closed, ShuttingDownError):
            return ShuttingDownError(str(closed))
        return EngineDeadError(str(closed) if closed is not None else "the engine is not running")

    def _deliver(self, updates: list[RequestUpdate]) -> None:
        for update in updates:
            self._pending.discard(update.request_id)
            stream = self._streams.get(update.request_id)
            if stream is None:
                continue  # aborted after the step produced it
            if update.finished:
                del self._streams[update.request_id]
            stream.put(update)

    def _fail_all(self, exc: BaseException) -> None:
        for stream in set(self._streams.values()):
            stream.fail(type(exc)(str(exc)))  # one instance each: tracebacks are per raise
        self._streams.clear()
        self._pending.clear()

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
        """Apply queued commands, then run one step if there is work. False: stop."""
        busy = self.engine.has_unfinished_requests()
        commands = [self._commands.get()] if not busy else []
        while True:
            try:
                commands.append(self._commands.get_nowait())
            except queue.Empty:
                break
        for cmd in commands:
            if isinstance(cmd, _Stop):
                self._abort_ids(self._tracker.live_ids())
                return False
            self._apply(cmd)
        updates = self._step() if self.engine.has_unfinished_requests() else []
        self.stats = self.engine.get_stats()
        if updates:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._deliver, updates)
        return True

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

    def _apply(self, cmd: Any) -> None:
        if isinstance(cmd, _Add):
            self._add(cmd)
        elif isinstance(cmd, _Abort):
            self._abort_ids(cmd.request_ids)
        elif isinstance(cmd, _Call):
            _run_into(cmd.future, cmd.fn, self.engine)

    def _add(self, cmd: _Add) -> None:
        if not cmd.future.set_running_or_notify_cancel():
            return  # the caller gave up before we got here
        added: list[str] = []
        try:
            for rid, prompt_ids in cmd.prompts:
                self.engine.add_request(rid, prompt_ids, cmd.params, cmd.arrival_time)
                self._tracker.track(rid, stop_holdback(cmd.params.stop))
                added.append(rid)
        except Exception as exc:  # InvalidRequestError mostly; all or none are added
            self._abort_ids(added)
            cmd.future.set_exception(exc)
            return
        cmd.future.set_result(None)

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
                _fail(future, exc)
        loop = self._loop
        if loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(self._fail_all, exc)
            except RuntimeError:  # the loop closed meanwhile
                pass


def _run_into(future: concurrent.futures.Future, fn: Callable[[Any], Any], arg: Any) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(fn(arg))
    except BaseException as exc:
        future.set_exception(exc)


def _fail(future: concurrent.futures.Future, exc: BaseException) -> None:
    try:
        future.set_exception(exc)
    except concurrent.futures.InvalidStateError:  # cancelled or done meanwhile
        pass
