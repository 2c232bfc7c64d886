"""The in-process backend: drives an `LLMEngine` (or anything with its API) one step per poll."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from kvtier.bench.backend import RequestRecord
from kvtier.bench.clock import Clock, MonotonicClock
from kvtier.bench.request import BenchRequest
from kvtier.engine.outputs import EngineStats, RequestOutput
from kvtier.sampling_params import InvalidRequestError, SamplingParams


class EngineLike(Protocol):
    """The part of `docs/ENGINE_API.md` the benchmark uses."""

    def add_request(
        self, request_id: str, prompt: list[int], params: SamplingParams, arrival_time: float | None = None
    ) -> None: ...

    def step(self) -> list[RequestOutput]: ...

    def abort_request(self, request_id: str | Iterable[str]) -> None: ...

    def has_unfinished_requests(self) -> bool: ...

    def get_stats(self) -> EngineStats: ...

    def close(self) -> None: ...


def _engine_clock(engine: EngineLike) -> Clock | None:
    clock = getattr(engine, "clock", None)
    return clock if hasattr(clock, "now") and hasattr(clock, "sleep") else None


def bench_sampling_params(output_len: int, ignore_eos: bool) -> SamplingParams:
    # Greedy and no detokenization: the benchmark measures the KV policy, not the sampler;
    # with ignore_eos every policy generates exactly the same number of tokens.
    return SamplingParams(
        temperature=0.0, max_tokens=output_len, ignore_eos=ignore_eos, detokenize=False
    )


class EngineBackend:
    """Calls `engine.step()` once per `poll`; the engine's own timestamps are the record."""

    def __init__(self, engine: EngineLike, ignore_eos: bool = True, clock: Clock | None = None):
        """`clock` defaults to the engine's own when that is a bench Clock (a simulator's
        virtual time), else time.monotonic, which LLMEngine stamps with."""
        self._engine: EngineLike | None = engine
        self._ignore_eos = ignore_eos
        self.clock: Clock = clock or _engine_clock(engine) or MonotonicClock()
        self._requests: dict[str, tuple[BenchRequest, float]] = {}
        self._latest: dict[str, RequestOutput] = {}  # last output seen per unfinished request
        self._ended: list[RequestRecord] = []

    @property
    def engine(self) -> EngineLike:
        if self._engine is None:
            raise RuntimeError("the backend is closed")
        return self._engine

    def submit(self, request_id: str, request: BenchRequest, arrival_time: float) -> None:
        self._requests[request_id] = (request, arrival_time)
        params = bench_sampling_params(request.output_len, self._ignore_eos)
        try:
            self.engine.add_request(request_id, list(request.prompt_token_ids), params, arrival_time)
        except InvalidRequestError as exc:
            self._ended.append(self._failed(request_id, f"rejected: {exc}"))

    def poll(self, timeout_s: float) -> list[RequestRecord]:
        if self.engine.has_unfinished_requests():
            for out in self.engine.step():
                self._latest[out.request_id] = out
                if out.finished:
                    self._ended.append(self._record(out))
        elif not self._ended and self._requests:
            # The engine holds nothing yet owes us requests: fail them rather than wait forever.
            for rid in list(self._requests):
                self._ended.append(self._failed(rid, "the engine dropped the request unfinished"))
        elif not self._ended:
            self.clock.sleep(timeout_s)
        ended, self._ended = self._ended, []
        for record in ended:
            self._requests.pop(record.request_id, None)
            self._latest.pop(record.request_id, None)
        return ended

    def num_unfinished(self) -> int:
        return len(self._requests)

    def abort(self, request_ids: Iterable[str]) -> None:
        ids = [r for r in request_ids if r in self._requests]
        self.engine.abort_request(ids)
        for rid in ids:
            out = self._latest.get(rid)
            record = self._record(out, "abort") if out is not None else self._failed(rid, None, "abort")
            self._ended.append(record)

    def stats(self) -> EngineStats | None:
        return self.engine.get_stats()

    def reset_prefix_cache(self) -> bool:
        reset = getattr(self.engine, "reset_prefix_cache", None)  # not in every EngineLike
        return bool(reset()) if reset is not None else False

    def close(self) -> None:
        self._requests.clear()
        self._latest.clear()
        if self._engine is not None:
            self._engine.close()  # its GPU memory goes now, before the next engine is built
        self._engine = None

    def _record(self, out: RequestOutput, reason: str | None = None) -> RequestRecord:
        request, arrival = self._requests[out.request_id]
        m = out.metrics
        if m is None:
            return self._failed(out.request_id, "the engine returned no metrics")
        completion = out.outputs[0]
        # Every metric leans on one stamp per token; a mismatch is an engine bug to surface.
        error = None
        if len(m.token_times) != len(completion.token_ids):
            error = f"{len(m.token_times)} token times for {len(completion.token_ids)} tokens"
        return RequestRecord(
            request_id=out.request_id,
            prompt_len=request.prompt_len,
            expected_output_len=request.output_len,
            arrival_s=m.arrival_time,
            first_token_s=m.first_token_time,
            token_times_s=tuple(m.token_times),
            finish_s=m.finished_time if reason is None else self.clock.now(),
            finish_reason=reason or completion.finish_reason,
            num_preemptions=m.num_preemptions,
            error=error,
            num_cached_tokens=out.num_cached_tokens,
            first_scheduled_s=m.first_scheduled_time,
        )

    def _failed(self, request_id: str, error: str | None, reason: str | None = None) -> RequestRecord:
        request, arrival = self._requests[request_id]
        return RequestRecord(
            request_id, request.prompt_len, request.output_len, arrival, None, (), None, reason, 0, error
        )
