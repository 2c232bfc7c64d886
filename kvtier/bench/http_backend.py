"""A bench `Backend` that drives `kvtier serve` (or another OpenAI-compatible server) over HTTP.

Each request is one streaming `POST /v1/completions` with the workload's exact prompt token
ids, greedy, `ignore_eos`, `max_tokens` = the output length, and `include_usage`: its last
chunk's usage.prompt_tokens_details.cached_tokens is the request's prefix-cache hit (None
for servers that do not send it). `return_token_ids` (vLLM's
extension, which kvtier serve implements) makes every chunk say how many tokens it carries,
so each token gets the arrival time of its chunk on this process's monotonic clock; servers
without it are counted one token per chunk, as vLLM's benchmark does. `stats()` scrapes the
server's /metrics (None for servers that are not kvtier), at most every `stats_interval_s`
and once more when the last request has ended, so a run's final counters are exact.

The streams run on an asyncio loop in one background thread; the runner's calls (all from
one thread) only hand work to that loop and read a queue of finished records.
"""

from __future__ import annotations

import asyncio
import json
import queue
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from kvtier.bench.backend import RequestRecord
from kvtier.bench.request import BenchRequest
from kvtier.engine.outputs import EngineStats
from kvtier.server.metrics import stats_from_metrics


@dataclass
class _Progress:
    """What one stream has seen so far (also what an aborted request reports)."""

    request_id: str
    request: BenchRequest
    arrival_time: float
    token_times: list[float] = field(default_factory=list)
    finish_reason: str | None = None
    error: str | None = None
    finish_time: float | None = None
    num_cached_tokens: int | None = None  # from the usage chunk, where the server sends one

    def record(self) -> RequestRecord:
        times = tuple(self.token_times)
        return RequestRecord(
            request_id=self.request_id,
            prompt_len=self.request.prompt_len,
            expected_output_len=self.request.output_len,
            arrival_s=self.arrival_time,
            first_token_s=times[0] if times else None,
            token_times_s=times,
            finish_s=self.finish_time if self.finish_reason is not None else None,
            finish_reason=self.finish_reason,
            error=self.error,
            num_cached_tokens=self.num_cached_tokens,
        )


class HTTPBackend:
    def __init__(
        self,
        base_url: str,
        *,
        model: str | None = None,
        api_key: str | None = None,
        ignore_eos: bool = True,
        stats_interval_s: float = 0.25,
        request_timeout_s: float = 3600.0,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model or self._first_model()
        self._ignore_eos = ignore_eos
        self._timeout_s = request_timeout_s
        self._stats_interval_s = stats_interval_s
        self._scrape_client = httpx.Client(base_url=self._base_url, timeout=30)
        self._stats: EngineStats | None = self._scrape()
        self._last_scrape = time.monotonic()
        self._rescrape = False  # set when the last unfinished request ended
        self._done: queue.Queue[RequestRecord] = queue.Queue()
        self._unfinished: set[str] = set()  # runner thread only
        self._tasks: dict[str, asyncio.Task] = {}  # loop thread only
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-backend", daemon=True)
        self._thread.start()
        self._client = self._call(self._open_client())

    # ------------------------------------------------------------------ Backend protocol
    def submit(self, request_id: str, request: BenchRequest, arrival_time: float) -> None:
        self._unfinished.add(request_id)
        progress = _Progress(request_id, request, arrival_time)
        self._loop.call_soon_threadsafe(self._start, progress)

    def poll(self, timeout_s: float) -> list[RequestRecord]:
        try:
            first = self._done.get(timeout=timeout_s) if timeout_s > 0 else self._done.get_nowait()
        except queue.Empty:
            return []
        records = [first]
        while True:
            try:
                records.append(self._done.get_nowait())
            except queue.Empty:
                break
        for record in records:
            self._unfinished.discard(record.request_id)
        self._rescrape = not self._unfinished
        return records

    def num_unfinished(self) -> int:
        return len(self._unfinished)

    def abort(self, request_ids: Iterable[str]) -> None:
        # Closing a stream makes the server abort the request and free its blocks.
        ids = [rid for rid in request_ids if rid in self._unfinished]
        if ids:
            self._loop.call_soon_threadsafe(self._cancel, ids)

    def stats(self) -> EngineStats | None:
        now = time.monotonic()
        if self._rescrape or now - self._last_scrape >= self._stats_interval_s:
            self._stats, self._last_scrape, self._rescrape = self._scrape(), now, False
        return self._stats

    def reset_prefix_cache(self) -> bool:
        """POST /reset_prefix_cache (kvtier's and vLLM's admin endpoint): True on a 200."""
        try:
            resp = self._scrape_client.post("/reset_prefix_cache", headers=self._headers)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        self._scrape_client.close()
        self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # ------------------------------------------------------------------ loop thread
    async def _open_client(self) -> httpx.AsyncClient:
        # No pool limit: a client-side queue would add its wait to every TTFT.
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        timeout = httpx.Timeout(self._timeout_s, connect=30.0)
        return httpx.AsyncClient(base_url=self._base_url, headers=self._headers, limits=limits, timeout=timeout)

    def _start(self, progress: _Progress) -> None:
        task = self._loop.create_task(self._stream(progress))
        self._tasks[progress.request_id] = task
        # A callback rather than try/finally: it also runs for a task cancelled before it began.
        task.add_done_callback(lambda t: self._finish(progress, t))

    def _cancel(self, request_ids: list[str]) -> None:
        for rid in request_ids:
            task = self._tasks.get(rid)
            if task is not None:
                task.cancel()

    def _finish(self, progress: _Progress, task: asyncio.Task) -> None:
        self._tasks.pop(progress.request_id, None)
        if task.cancelled():
            progress.finish_reason, progress.finish_time = "abort", time.monotonic()
        elif (exc := task.exception()) is not None:
            progress.error = f"{type(exc).__name__}: {exc}"
        elif progress.finish_reason is None and progress.error is None:
            progress.error = "the stream ended without a finish reason"
        self._done.put(progress.record())

    async def _stream(self, p: _Progress) -> None:
        body = {
            "model": self._model,
            "prompt": list(p.request.prompt_token_ids),
            "max_tokens": p.request.output_len,
            "temperature": 0.0,
            "ignore_eos": self._ignore_eos,
            "stream": True,
            "return_token_ids": True,
            # The final chunk then carries usage.prompt_tokens_details.cached_tokens.
            "stream_options": {"include_usage": True},
        }
        async with self._client.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                p.error = f"HTTP {resp.status_code}: {_error_message(await resp.aread())}"
                return
            async for line in resp.aiter_lines():
                if not line.startswith("data: "):
                    continue
                if line == "data: [DONE]":
                    break
                self._on_chunk(p, json.loads(line[6:]), time.monotonic())

    @staticmethod
    def _on_chunk(p: _Progress, chunk: dict[str, Any], now: float) -> None:
        if "error" in chunk:
            p.error = str(chunk["error"].get("message", chunk["error"]))
            return
        details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
        if details.get("cached_tokens") is not None:
            p.num_cached_tokens = int(details["cached_tokens"])
        for choice in chunk.get("choices", []):
            ids = choice.get("token_ids")
            num_tokens = len(ids) if ids is not None else 1
            p.token_times.extend([now] * num_tokens)
            if choice.get("finish_reason"):
                p.finish_reason, p.finish_time = choice["finish_reason"], now

    async def _shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
        await self._client.aclose()
        await self._loop.shutdown_asyncgens()

    # ------------------------------------------------------------------ runner thread
    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def _first_model(self) -> str:
        resp = httpx.get(f"{self._base_url}/v1/models", headers=self._headers, timeout=30)
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]

    def _scrape(self) -> EngineStats | None:
        try:
            resp = self._scrape_client.get("/metrics")
            return stats_from_metrics(resp.text) if resp.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return None


def _error_message(body: bytes) -> str:
    try:
        return str(json.loads(body)["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return body[:200].decode("utf-8", "replace")
