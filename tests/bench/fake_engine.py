"""A deterministic engine with LLMEngine's API on a virtual clock, for the harness's tests.

Each step: preempt (recompute) the newest running requests until everyone's next token
fits in the KV pool, admit waiting requests that fit, then every running request gets one
token. The step lasts `base_s + per_token_s * scheduled tokens` of virtual time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvtier.engine.outputs import CompletionOutput, EngineStats, RequestMetrics, RequestOutput
from kvtier.sampling_params import InvalidRequestError, SamplingParams


class VirtualClock:
    def __init__(self, start: float = 1000.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.0)


@dataclass
class _Req:
    rid: str
    prompt: list[int]
    max_tokens: int
    metrics: RequestMetrics
    out: list[int] = field(default_factory=list)
    computed: bool = False  # KV present (prefilled and not preempted since)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt) + len(self.out)


class FakeEngine:
    def __init__(self, clock: VirtualClock, num_blocks: int = 64, block_size: int = 4,
                 base_s: float = 0.01, per_token_s: float = 0.001, max_num_seqs: int = 8,
                 max_model_len: int = 512):
        self.clock, self.num_blocks, self.block_size = clock, num_blocks, block_size
        self.base_s, self.per_token_s, self.max_num_seqs = base_s, per_token_s, max_num_seqs
        self.max_model_len = max_model_len
        self.waiting: list[_Req] = []
        self.running: list[_Req] = []
        self.preemptions = self.recomputed = self.prompt_tokens = self.gen_tokens = 0
        self.last_tokens, self.last_time = 0, 0.0

    def add_request(self, request_id, prompt, params: SamplingParams, arrival_time=None):
        if len(prompt) + params.max_tokens > self.max_model_len:
            raise InvalidRequestError("too long")
        m = RequestMetrics(arrival_time=arrival_time if arrival_time is not None else self.clock.now())
        self.waiting.append(_Req(request_id, list(prompt), params.max_tokens, m))

    def _blocks(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def _used(self) -> int:
        return sum(self._blocks(r.num_tokens) for r in self.running)

    def step(self) -> list[RequestOutput]:
        need = lambda r: self._blocks(r.num_tokens + 1)  # noqa: E731 - room for the next token
        while self.running and sum(need(r) for r in self.running) > self.num_blocks:
            victim = self.running.pop()
            victim.computed = False
            victim.metrics.num_preemptions += 1
            self.preemptions += 1
            self.waiting.insert(0, victim)
        tokens = 0
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            if sum(need(x) for x in self.running) + need(r) > self.num_blocks:
                break
            self.waiting.pop(0)
            self.running.append(r)
        for r in self.running:
            if not r.computed:
                tokens += r.num_tokens
                if r.metrics.num_preemptions:
                    self.recomputed += r.num_tokens
                else:
                    self.prompt_tokens += len(r.prompt)
                r.computed = True
            else:
                tokens += 1
        self.last_tokens, self.last_time = tokens, self.base_s + self.per_token_s * tokens
        self.clock.sleep(self.last_time)
        now = self.clock.now()
        outs = []
        for r in list(self.running):
            r.out.append(7)
            self.gen_tokens += 1
            r.metrics.token_times.append(now)
            if r.metrics.first_token_time is None:
                r.metrics.first_token_time = now
            done = len(r.out) == r.max_tokens
            if done:
                r.metrics.finished_time = now
                self.running.remove(r)
            comp = CompletionOutput(0, "", list(r.out), finish_reason="length" if done else None)
            outs.append(RequestOutput(r.rid, None, r.prompt, [comp], done, r.metrics))
        return outs

    def abort_request(self, request_id):
        ids = {request_id} if isinstance(request_id, str) else set(request_id)
        self.waiting = [r for r in self.waiting if r.rid not in ids]
        self.running = [r for r in self.running if r.rid not in ids]

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def close(self) -> None:
        self.closed = True

    def get_stats(self) -> EngineStats:
        return EngineStats(
            num_running=len(self.running), num_waiting=len(self.waiting), num_swapped=0,
            gpu_blocks_used=self._used(), gpu_blocks_total=self.num_blocks,
            host_blocks_used=0, host_blocks_total=0,
            num_preemptions_total=self.preemptions, num_swap_out_blocks_total=0,
            num_swap_in_blocks_total=0, num_recomputed_tokens_total=self.recomputed,
            num_prompt_tokens_total=self.prompt_tokens,
            num_generation_tokens_total=self.gen_tokens,
            num_scheduled_tokens=self.last_tokens, block_bytes=1024, step_time_s=self.last_time,
        )
