"""Every engine option in one dataclass, with vLLM's names, shared by the Python API and by
`kvtier generate | serve | bench`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Self

from kvtier.config import CacheConfig, ConfigError, EngineConfig, ModelConfig, SchedulerConfig
from kvtier.engine.other_flags import add_other_flags, model_from_args
from kvtier.model.generation_config import parse_override
from kvtier.model.hf_config import exact_context
from kvtier.model.loader import resolve_model_config
from kvtier.offload.args import HostTierArgs
from kvtier.policies import get_system, policy_names
from kvtier.policies.options import SystemArgs, arg_type
from kvtier.policies.registry import policy_flag_defaults, system_args

logger = logging.getLogger("kvtier")

# The default cap on a prompt's chunk per step (--long-prefill-token-threshold): the largest
# that kept the 8B's ITL p99 within the TPOT SLO on L-Eval documents, on the
# H200 (results/serving/long_prefill_itl_h200.json) as in the simulator
# (long_prefill_itl_sim_h200_p1.json). The offline LLM sets 0.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 2048


@dataclass
class EngineArgsFields:
    """EngineArgs' fields and methods; EngineArgs adds the memory systems' flags."""

    model: str = field(metadata={"help": "local HF model directory, or a dummy preset name"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer directory"})
    chat_template: str | None = field(default=None, metadata={
        "help": "a chat template, a file or the Jinja text itself, in place of the "
        "tokenizer's (vLLM's --chat-template)"})
    dtype: str = field(default="auto", metadata={"help": "auto|float32|bfloat16|float16"})
    device: str = field(default="auto", metadata={"help": "auto|cpu|cuda"})
    load_format: str = field(default="auto", metadata={"help": "auto|safetensors|dummy"})
    seed: int = field(default=0, metadata={"help": "seed for dummy weights",
                                           "aliases": ("--random-seed",)})
    max_model_len: int | None = field(default=None, metadata={
        "help": "context length limit", "aliases": ("--context-length",)})
    max_num_batched_tokens: int | None = field(
        default=None, metadata={"help": "token budget of one step (default 8192)"})
    max_num_seqs: int = field(default=256, metadata={
        "help": "running requests at most", "aliases": ("--max-running-requests",)})
    enable_chunked_prefill: bool = field(default=True, metadata={"help": "split long prefills"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV block",
                                                  "aliases": ("--page-size",)})
    layers_per_block: int = field(
        default=4, metadata={"help": "F: layers per KV block (num_layers = vLLM's layout)"})
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "fraction of GPU memory for weights+activations+KV "
                                       "(SGLang's --mem-fraction-static is taken as it)",
                               "aliases": ("--mem-fraction-static",)})
    kv_cache_gb: float | None = field(default=None, metadata={"help": "device KV pool size"})
    swap_space: float = field(default=4.0, metadata={"help": "host KV pool in GiB"})
    num_gpu_blocks: int | None = field(
        default=None, metadata={"help": "override the device pool's block count"})
    num_host_blocks: int | None = field(
        default=None, metadata={"help": "override the host pool's block count"})
    kv_policy: str = field(default="recompute", metadata={"help": "KV-memory policy"})
    enable_prefix_caching: bool | None = field(
        default=None, metadata={"help": "reuse the KV of prompt prefixes that earlier requests "
                                        "computed (default: on, unless the memory system "
                                        "cannot share blocks)"})
    prefix_caching_hash_algo: str = field(
        default="sha256", metadata={"help": "sha256|builtin: the block hash of the prefix "
                                            "cache (builtin: faster, for trusted prompts)"})
    attention_backend: str = field(default="auto", metadata={"help": "auto|torch|triton"})
    enforce_eager: bool = field(default=False, metadata={"help": "disable CUDA graphs"})
    max_graph_batch_size: int = field(
        default=512, metadata={"help": "largest decode batch replayed as a full CUDA graph "
                                       "(larger ones run as pieces around eager attention)"})
    piecewise_graphs: bool = field(
        default=True, metadata={"help": "CUDA graphs around attention for mixed steps"})
    overlap_swap: bool = field(
        default=True, metadata={"help": "swap-in copies overlap the forward layer group by "
                                        "layer group (--no-overlap-swap: copies first)"})
    async_scheduling: bool | None = field(
        default=None, metadata={"help": "schedule and launch step N+1 while step N runs on "
                                        "the GPU (host work hidden behind the GPU); default: "
                                        "on for a GPU, off on the CPU and in the simulator"})
    served_model_name: str | None = field(default=None, metadata={"help": "name in the API"})
    max_logprobs: int = field(
        default=20, metadata={"help": "top logprobs a request may ask for, per token and for "
                                      "the prompt (vLLM's; -1: the whole vocabulary)"})
    generation_config: str = field(
        default="auto", metadata={"help": "default sampling (temperature, top_p, top_k, min_p, "
                                          "repetition_penalty, max_new_tokens) and end tokens "
                                          "for requests that do not set them: auto, the model's "
                                          "generation_config.json; vllm, none; or a folder"})
    override_generation_config: str | None = field(
        default=None, metadata={"help": "JSON object of those fields, over the file's, e.g. "
                                        "'{\"temperature\": 0.5}'"})
    max_waiting_requests: int | None = field(
        default=None, metadata={"help": "bound on queued requests (server back-pressure)"})
    long_prefill_token_threshold: int | None = field(
        default=None, metadata={"help": "a prompt's chunk per step at most, so the decodes "
                                        "that share the step wait less (0: no cap; default: "
                                        f"{DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD} with chunked "
                                        "prefill, 0 in the offline LLM)"})
    max_num_partial_prefills: int = field(
        default=1, metadata={"help": "prefills that may stop part-way in one step"})
    schedule_policy: str = field(
        default="fcfs", metadata={"help": "waiting queue order: fcfs (vLLM's), priority "
                                          "(vLLM's: a request's priority, lower first, then "
                                          "arrival) or lpm (SGLang's: the longest cached "
                                          "prefix first)",
                                  "aliases": ("--scheduling-policy",)})
    tensor_parallel_size: int = field(
        default=1, metadata={"help": "GPUs (CPU processes) the model is split over, one "
                                     "process each (docs/TENSOR_PARALLEL.md)",
                             "aliases": ("-tp", "--tp-size", "--tp")})
    # The prefix cache's host tier (kvtier/offload/args.py has its flags).
    host_tier: HostTierArgs = field(default_factory=HostTierArgs, metadata={"cli": False})
    # The memory systems' own flags (each system's SystemArgs), by keyword;
    # EngineArgs(<prefix>_<flag>=...) and args.<prefix>_<flag> read and write them here.
    policy_args: dict[str, Any] = field(default_factory=dict, metadata={"cli": False})

    def system_args(self, name: str) -> SystemArgs:
        """The flags of memory system `name`, from the given values and its defaults."""
        return get_system(name).args.from_values(self.policy_args)

    def create_engine_config(self) -> EngineConfig:
        model_config, _ = resolve_model_config(self.model, self.load_format)
        max_len = _max_model_len(self.max_model_len, model_config)
        sched = SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens
            or (8192 if self.enable_chunked_prefill else max(8192, max_len)),
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            max_waiting_requests=self.max_waiting_requests,
            async_scheduling=self.async_scheduling,
            long_prefill_token_threshold=self._long_prefill_threshold(),
            max_num_partial_prefills=self.max_num_partial_prefills,
            schedule_policy=self.schedule_policy,
        )
        cache = CacheConfig(
            block_size=self.block_size,
            layers_per_block=self.layers_per_block,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_gb=self.kv_cache_gb,
            swap_space_gb=self.swap_space,
            num_gpu_blocks=self.num_gpu_blocks,
            num_host_blocks=self.num_host_blocks,
            enable_prefix_caching=self.enable_prefix_caching,
            prefix_caching_hash_algo=self.prefix_caching_hash_algo,
        )
        config = EngineConfig(
            model=self.model, model_config=model_config, cache=cache, scheduler=sched,
            kv_policy=self.kv_policy, dtype=self.dtype, device=self.device,
            load_format=self.load_format, tokenizer=self.tokenizer,
            chat_template=self.chat_template, seed=self.seed,
            attention_backend=self.attention_backend, enforce_eager=self.enforce_eager,
            max_graph_batch_size=self.max_graph_batch_size,
            piecewise_graphs=self.piecewise_graphs, overlap_swap=self.overlap_swap,
            served_model_name=self.served_model_name,
            max_logprobs=self.max_logprobs,
            generation_config=self.generation_config,
            override_generation_config=parse_override(self.override_generation_config),
        )
        system = get_system(self.kv_policy)
        for name in policy_names():  # flags of the other systems must not be set for nothing
            if name != self.kv_policy:
                get_system(name).check_unused_flags(self.system_args(name))
        return config.with_(policy_options=system.options(self.system_args(self.kv_policy),
                                                          config))

    def _long_prefill_threshold(self) -> int:
        if self.long_prefill_token_threshold is not None:
            return self.long_prefill_token_threshold
        return DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD if self.enable_chunked_prefill else 0

    # ---- argparse ----------------------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, positional_model: bool = True,
                     model_path_flag: bool = False) -> None:
        """`model_path_flag`: SGLang's --model-path may stand for the positional MODEL (a
        command whose other positionals would make that ambiguous leaves it off)."""
        for f in fields(cls):
            if not f.metadata.get("cli", True):
                continue
            if f.name == "model":
                if positional_model:
                    parser.add_argument("model", nargs="?" if model_path_flag else None,
                                        help=f.metadata["help"])
                else:
                    parser.add_argument("--model", required=True, help=f.metadata["help"])
                continue
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            if "bool" in str(f.type):  # bool, or bool | None (unset: the engine decides)
                parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                    default=default, help=f.metadata["help"])
            else:
                parser.add_argument(flag, *f.metadata.get("aliases", ()),
                                    type=arg_type(f.type), default=default,
                                    help=f.metadata["help"])
        parser.add_argument("--num-gpu-blocks-override", dest="num_gpu_blocks", type=int,
                            help="vLLM's name for --num-gpu-blocks")
        add_other_flags(parser, positional_model and model_path_flag)
        HostTierArgs.add_cli_args(parser)
        taken: set[str] = set()
        for args_cls in system_args().values():  # every memory system's own flags
            args_cls.add_cli_args(parser, taken)

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> Self:
        kw: dict[str, Any] = {f.name: getattr(ns, f.name) for f in fields(cls)
                              if f.metadata.get("cli", True) and hasattr(ns, f.name)}
        flags = policy_flag_defaults()
        kw["policy_args"] = {k: getattr(ns, k) for k in flags if hasattr(ns, k)}
        kw["host_tier"] = HostTierArgs.from_cli_args(ns)
        kw["model"] = model_from_args(ns)
        return cls(**kw)


class EngineArgs(EngineArgsFields):
    """Every engine option: the fields above plus each registered memory system's flags,
    given by keyword (`EngineArgs(model=..., <prefix>_<flag>=...)`) and read as attributes."""

    def __init__(self, *args: Any, **kw: Any):
        tier = _host_tier_keywords(kw)
        if tier:
            if kw.get("host_tier") is not None:
                raise TypeError(f"EngineArgs got the host tier's options {sorted(tier)} and "
                                f"host_tier=; give one or the other")
            kw["host_tier"] = HostTierArgs(**tier)
        given = dict(kw.pop("policy_args", None) or {})
        known = policy_flag_defaults()
        for key in [k for k in kw if k in known]:
            given[key] = kw.pop(key)
        unknown = set(given) - set(known)
        if unknown:
            raise TypeError(f"EngineArgs got unknown options {sorted(unknown)}")
        super().__init__(*args, **kw)
        self.policy_args = given

    def __getattr__(self, name: str) -> Any:
        known = policy_flag_defaults()
        if name in known:  # only called for names that are not fields
            return self.__dict__.get("policy_args", {}).get(name, known[name])
        if name in _HOST_TIER_FIELDS and "host_tier" in self.__dict__:
            return getattr(self.__dict__["host_tier"], name)
        raise AttributeError(f"EngineArgs has no option {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name in policy_flag_defaults():
            self.policy_args[name] = value
        elif name in _HOST_TIER_FIELDS:
            self.host_tier = dataclasses.replace(self.host_tier, **{name: value})
        else:
            super().__setattr__(name, value)


# The host tier's options by keyword, as vLLM's LLM(kv_offloading_size=...) and SGLang's
# Engine(hicache_size=..., enable_hierarchical_cache=...) take them; SGLang's size name is an
# alias of vLLM's, as on the command line.
_HOST_TIER_FIELDS = frozenset(f.name for f in fields(HostTierArgs))
_HOST_TIER_ALIASES = {"hicache_size": "kv_offloading_size"}


def _host_tier_keywords(kw: dict[str, Any]) -> dict[str, Any]:
    """Pops the host tier's options (and their aliases) out of `kw`."""
    tier: dict[str, Any] = {}
    for key in [k for k in kw if k in _HOST_TIER_FIELDS or k in _HOST_TIER_ALIASES]:
        name = _HOST_TIER_ALIASES.get(key, key)
        if name in tier:
            raise TypeError(f"EngineArgs got {name} twice (hicache_size is its alias)")
        tier[name] = kw.pop(key)
    return tier


def _max_model_len(requested: int | None, mc: ModelConfig) -> int:
    """--max-model-len, else the model's positions; at most the context kvtier computes as
    HF does (a sliding window's, a long-context rope's: `hf_config.exact_context`)."""
    limit = exact_context(mc)
    if limit is None or (requested is not None and requested <= limit[0]):
        return requested or mc.max_position_embeddings
    n, why = limit
    if requested is not None:
        raise ConfigError(f"--max-model-len {requested}: {mc.name} {why}; at most {n}")
    if mc.max_position_embeddings > n:
        logger.warning("%s: max_model_len capped at %d tokens: it %s", mc.name, n, why)
    return min(n, mc.max_position_embeddings)
