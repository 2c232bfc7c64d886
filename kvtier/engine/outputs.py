"""What the engine hands back to its callers (the LLM API, the server, the bench harness)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvtier.offload.metrics import HostTierMetrics


@dataclass
class RequestMetrics:
    arrival_time: float  # time.monotonic() when the request was added
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)  # one per output token
    finished_time: float | None = None
    num_preemptions: int = 0


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None = None
    logprobs: list[dict[int, float]] | None = None  # per token: {token_id: logprob}
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop token id or stop string that matched

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    # vLLM's: prompt tokens whose KV came from the prefix cache when the request was first
    # admitted (its first sequence's, for n > 1); None before its first admission.
    num_cached_tokens: int | None = None
    # vLLM's, with SamplingParams(prompt_logprobs=k): per prompt token {token id: logprob}
    # (its own and the k likeliest at its position), None for the first token.
    prompt_logprobs: list[dict[int, float] | None] | None = None


@dataclass(frozen=True)
class EngineStats:
    """A snapshot after a step: what the bench harness and /metrics record."""

    num_running: int
    num_waiting: int
    num_swapped: int
    gpu_blocks_used: int  # held by requests; cached blocks nobody holds count as free
    gpu_blocks_total: int
    host_blocks_used: int
    host_blocks_total: int
    num_preemptions_total: int
    num_swap_out_blocks_total: int
    num_swap_in_blocks_total: int
    num_recomputed_tokens_total: int  # prompt+output tokens prefilled again after preemption
    num_prompt_tokens_total: int
    num_generation_tokens_total: int
    num_scheduled_tokens: int  # in the last step
    block_bytes: int
    step_time_s: float  # wall time of the last step
    num_scheduled_requests: int = 0  # in the last step
    num_prefix_recompute_tokens_total: int = 0  # dropped-prefix tokens recomputed
    num_dropped_tokens: int = 0  # tokens of running requests whose KV is dropped now
    num_restored_tokens_total: int = 0  # tokens whose KV was re-projected from hidden states
    # Prefix cache (kvtier/kv/prefix_cache.py, PrefixCacheStats): device blocks only the
    # cache holds (evictable, free on demand), and lookups in tokens as vLLM counts them:
    # one per admission of a new request; re-admissions after preemption apart.
    gpu_blocks_cached: int = 0
    num_prefix_cache_queries_total: int = 0
    num_prefix_cache_hits_total: int = 0
    num_prefix_cache_preempted_queries_total: int = 0
    num_prefix_cache_preempted_hits_total: int = 0
    num_prefix_cache_evicted_blocks_total: int = 0  # token blocks (a device block per group)
    host_tier: HostTierMetrics | None = None  # the prefix cache's host tier, when it has one
