"""Typed, frozen configuration of each component. Derived values are properties; no I/O here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Any

SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Phi3ForCausalLM",  # Llama's layers with q/k/v and gate/up stored fused (checkpoint.py)
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


class ConfigError(ValueError):
    """The configuration cannot be served (bad option, unsupported model, does not fit)."""


@dataclass(frozen=True)
class ModelConfig:
    """The architecture of a decoder-only Llama-family model (what HF's config.json says)."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: tuple[tuple[str, Any], ...] | None = None  # dict items, hashable
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    name: str = "model"
    # An active sliding window (Mistral's `sliding_window`, Qwen's with `use_sliding_window`):
    # kvtier attends over the whole context, which equals the window's attention only while
    # the context fits in it, so the engine caps max_model_len there (engine/args.py).
    sliding_window: int | None = None

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def rope_scaling_dict(self) -> dict[str, Any] | None:
        return dict(self.rope_scaling) if self.rope_scaling else None

    def num_params(self) -> int:
        h, i, v = self.hidden_size, self.intermediate_size, self.vocab_size
        attn = h * (self.q_size + 2 * self.kv_size) + self.q_size * h
        mlp = 3 * h * i
        per_layer = attn + mlp + 2 * h
        emb = v * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + emb + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes

    def hidden_bytes_per_token(self, dtype_bytes: int) -> int:
        """Every layer's attention input, per token (what a hidden-state store keeps)."""
        return self.num_layers * self.hidden_size * dtype_bytes


@dataclass(frozen=True)
class CacheConfig:
    """Geometry and size of the KV pools.

    A physical block holds `layers_per_block` (F) consecutive layers x `block_size` tokens of
    K and V. F = num_layers is vLLM's layout; the default is F = 4.
    """

    block_size: int = 16
    layers_per_block: int = 4
    gpu_memory_utilization: float = 0.9
    kv_cache_gb: float | None = None  # explicit device-pool size; overrides utilization
    swap_space_gb: float = 4.0  # pinned host pool
    num_gpu_blocks: int | None = None  # explicit block counts (tests, simulator)
    num_host_blocks: int | None = None
    # Automatic prefix caching of device blocks (kvtier/kv/prefix_cache.py); None: on unless
    # the memory system cannot share blocks.
    enable_prefix_caching: bool | None = None
    prefix_caching_hash_algo: str = "sha256"

    def __post_init__(self) -> None:
        if self.prefix_caching_hash_algo not in ("sha256", "builtin"):
            raise ConfigError("prefix_caching_hash_algo must be sha256 or builtin, got "
                              f"{self.prefix_caching_hash_algo!r}")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        if self.layers_per_block < 1:
            raise ConfigError(f"layers_per_block must be >= 1, got {self.layers_per_block}")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise ConfigError("gpu_memory_utilization must be in (0, 1]")
        if self.swap_space_gb < 0:
            raise ConfigError("swap_space must be >= 0")

    def num_layer_groups(self, num_layers: int) -> int:
        return math.ceil(num_layers / min(self.layers_per_block, num_layers))

    def layers_in_block(self, num_layers: int) -> int:
        return min(self.layers_per_block, num_layers)

    def block_bytes(self, model: ModelConfig, dtype_bytes: int) -> int:
        return 2 * self.layers_in_block(model.num_layers) * self.block_size * model.kv_size * dtype_bytes


# The waiting queue's orders (kvtier/scheduler/queue.py): vLLM's and SGLang's.
SCHEDULE_POLICIES = ("fcfs", "lpm", "priority")

@dataclass(frozen=True)
class SchedulerConfig:
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int = 4096
    enable_chunked_prefill: bool = True
    max_waiting_requests: int | None = None  # None: unbounded (the server bounds it)
    # Schedule step N+1 while step N runs on the GPU: a request whose token from step N is
    # not back yet decodes a placeholder the runner fills on the device (PLACEHOLDER_TOKEN).
    # None: the executor's default (on for the GPU model runner; the CPU runner and the
    # simulator step synchronously). LLMEngine resolves it to a bool.
    async_scheduling: bool | None = None
    # vLLM's long-prefill controls (kvtier/scheduler/prefill_budget.py): a prompt's chunk per
    # step is capped at long_prefill_token_threshold (0: no cap), and at most
    # max_num_partial_prefills prefills stop part-way in one step.
    long_prefill_token_threshold: int = 0
    max_num_partial_prefills: int = 1
    # The waiting queue's order (kvtier/scheduler/queue.py): fcfs (vLLM's), priority (vLLM's:
    # requests' priority, then arrival) or lpm (SGLang's longest prefix match).
    schedule_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1 or self.max_model_len < 1:
            raise ConfigError("max_num_batched_tokens, max_num_seqs and max_model_len must be >= 1")
        if self.long_prefill_token_threshold < 0 or self.max_num_partial_prefills < 1:
            raise ConfigError(
                f"long_prefill_token_threshold must be >= 0 (0: off) and max_num_partial_prefills "
                f">= 1, got {self.long_prefill_token_threshold} and {self.max_num_partial_prefills}")
        if not self.enable_chunked_prefill and (self.long_prefill_token_threshold
                                                or self.max_num_partial_prefills > 1):
            raise ConfigError("long_prefill_token_threshold and max_num_partial_prefills > 1 "
                              "need chunked prefill")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ConfigError(f"--schedule-policy: one of {', '.join(SCHEDULE_POLICIES)}, not "
                              f"{self.schedule_policy!r}")
        if not self.enable_chunked_prefill and self.max_num_batched_tokens < self.max_model_len:
            raise ConfigError(
                "without chunked prefill, max_num_batched_tokens must be >= max_model_len"
            )

    @property
    def effective_long_prefill_threshold(self) -> int:
        """The chunk cap: vLLM's rule, 4 % of max_model_len when several partial prefills
        are allowed and no threshold is given."""
        if self.long_prefill_token_threshold or self.max_num_partial_prefills == 1:
            return self.long_prefill_token_threshold
        return max(1, int(self.max_model_len * 0.04))


@dataclass(frozen=True)
class SystemOptions:
    """Base of a memory system's typed options (`EngineConfig.policy_options`); each system
    subclasses it in its package (kvtier/policies/<name>/). Systems without knobs use it as
    is."""


@dataclass(frozen=True)
class GenerationDefaults:
    """What the model's generation_config.json asks of requests that do not say
    (kvtier/model/generation_config.py reads it): sampling fields by SamplingParams' names
    (temperature, top_p, top_k, min_p, repetition_penalty, max_tokens), and end tokens."""

    sampling: tuple[tuple[str, Any], ...] = ()
    eos_token_ids: tuple[int, ...] = ()

    def get(self, name: str, fallback: Any) -> Any:
        return dict(self.sampling).get(name, fallback)


@dataclass(frozen=True)
class EngineConfig:
    model: str
    model_config: ModelConfig
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    kv_policy: str = "recompute"
    policy_options: SystemOptions = field(default_factory=SystemOptions)
    dtype: str = "auto"  # resolved: float32 on CPU, bfloat16 on GPU unless given
    device: str = "auto"
    load_format: str = "auto"  # auto | safetensors | dummy
    tokenizer: str | None = None
    chat_template: str | None = None  # a file or the Jinja text, in place of the tokenizer's
    seed: int = 0
    attention_backend: str = "auto"  # auto | torch | triton
    enforce_eager: bool = False  # no CUDA graphs
    # Decode steps up to this many requests replay a full-model graph; larger ones run as
    # pieces around eager attention (vLLM's default cap is 512).
    max_graph_batch_size: int = 512
    # Steps with prefill rows run as graph pieces around eager attention (captured when CUDA
    # graphs are allowed; a system that captures every layer's input replays pieces for
    # decode steps too, no full-model graph).
    piecewise_graphs: bool = True
    # Swap copies on their own CUDA stream, the forward waiting per layer group only before
    # that group's first attention (kvtier/runner/swap_copies.py); off: copies then forward.
    overlap_swap: bool = True
    served_model_name: str | None = None
    max_logprobs: int = 20  # logprobs / prompt_logprobs a request may ask for; -1: the vocabulary
    # Where default sampling and end tokens come from (vLLM's --generation-config): auto,
    # the model folder's generation_config.json; vllm, nowhere; else a folder of one. The
    # override's fields win over the file's; `generation_defaults` is what they resolved to.
    generation_config: str = "auto"
    override_generation_config: tuple[tuple[str, Any], ...] = ()
    generation_defaults: GenerationDefaults = field(default_factory=GenerationDefaults)

    def __post_init__(self) -> None:
        if self.max_graph_batch_size < 1:
            raise ConfigError(f"max_graph_batch_size must be >= 1, got {self.max_graph_batch_size}")
        if self.max_logprobs < -1:
            raise ConfigError(f"max_logprobs must be >= 0, or -1 for the vocabulary, got {self.max_logprobs}")

    @property
    def logprobs_limit(self) -> int:
        """The most logprobs a request may ask for (-1 resolved to the vocabulary)."""
        return self.model_config.vocab_size if self.max_logprobs == -1 else self.max_logprobs

    def with_(self, **kw: Any) -> EngineConfig:
        return replace(self, **kw)


def dataclass_option_names(cls: type) -> list[str]:
    return [f.name for f in fields(cls)]
