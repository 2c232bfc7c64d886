"""Every engine option in one dataclass, with vLLM's names, shared by the Python API and by
`kvtier generate | serve | bench`."""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from kvtier.config import (
    CacheConfig,
    ConfigError,
    EngineConfig,
    ModelConfig,
    PolicyOptions,
    SchedulerConfig,
)
from kvtier.model.loader import resolve_model_config

# The default cap on a prompt's chunk per step (--long-prefill-token-threshold): the largest
# that kept the 8B's ITL p99 within a 100 ms TPOT SLO on L-Eval documents at 1 req/s
# (results/serving/long_prefill_itl_sim_h200_p1.json). The offline LLM sets 0.
DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD = 2048


@dataclass
class EngineArgs:
    model: str = field(metadata={"help": "local HF model directory, or a dummy preset name"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer directory"})
    dtype: str = field(default="auto", metadata={"help": "auto|float32|bfloat16|float16"})
    device: str = field(default="auto", metadata={"help": "auto|cpu|cuda"})
    load_format: str = field(default="auto", metadata={"help": "auto|safetensors|dummy"})
    seed: int = field(default=0, metadata={"help": "seed for dummy weights"})
    max_model_len: int | None = field(default=None, metadata={"help": "context length limit"})
    max_num_batched_tokens: int | None = field(
        default=None, metadata={"help": "token budget of one step (default 8192)"})
    max_num_seqs: int = field(default=256, metadata={"help": "running requests at most"})
    enable_chunked_prefill: bool = field(default=True, metadata={"help": "split long prefills"})
    block_size: int = field(default=16, metadata={"help": "tokens per KV block"})
    layers_per_block: int = field(
        default=4, metadata={"help": "F: layers per KV block (num_layers = vLLM's layout)"})
    gpu_memory_utilization: float = field(
        default=0.9, metadata={"help": "fraction of GPU memory for weights+activations+KV"})
    kv_cache_gb: float | None = field(default=None, metadata={"help": "device KV pool size"})
    swap_space: float = field(default=4.0, metadata={"help": "host KV pool in GiB"})
    num_gpu_blocks: int | None = field(
        default=None, metadata={"help": "override the device pool's block count"})
    num_host_blocks: int | None = field(
        default=None, metadata={"help": "override the host pool's block count"})
    kv_policy: str = field(default="recompute", metadata={"help": "KV-memory policy"})
    num_hidden_blocks: int | None = field(
        default=None, metadata={"help": "hcache: host hidden-state blocks (default: --swap-space)"})
    ellm_uncached_ratio: float | None = field(
        default=None, metadata={"help": "ellm: fixed uncached ratio r for every request"})
    ellm_max_uncached_ratio: float = field(
        default=0.5, metadata={"help": "ellm: cap on r when prefixes are dropped on demand"})
    ellm_max_recompute_tokens: int | None = field(
        default=None, metadata={"help": "ellm: prefix tokens recomputed per step at most, "
                                        "the recompute scratch (default: 256 for a priced "
                                        "--ellm-recompute-budget, else half the step's "
                                        "token budget)"})
    ellm_host_groups: str = field(
        default="0", metadata={"help": "ellm: a dropped prefix keeps its KV of this many top "
                                       "layer groups in the host pool, copied in each step "
                                       "while the lower groups recompute (layer-level "
                                       "overlap); auto: the split whose copy and recompute "
                                       "times match on the H200 roofline; 0: all recompute"})
    ellm_copy_window: int = field(
        default=2, metadata={"help": "ellm: of the copied-in layer groups, how many are in "
                                     "flight at once (they share that many sets of scratch; "
                                     "0: all)"})
    ellm_recompute_budget: str = field(
        default="auto", metadata={"help": "ellm: prefix tokens a step may recompute when "
                                          "prefixes are dropped on demand: ridge (ridge point "
                                          "minus the step's decodes), cost (priced by the "
                                          "calibrated cost model), auto (cost with "
                                          "--ellm-calibration, else ridge), max, or a count"})
    ellm_planner: bool = field(
        default=False, metadata={"help": "ellm: r from the request-level planner (SLSQP)"})
    ellm_tpot_slo_ms: float = field(
        default=100.0, metadata={"help": "ellm planner: the TPOT SLO it plans for"})
    ellm_calibration: str | None = field(
        default=None, metadata={"help": "ellm: cost-model calibration JSON (kvtier profile) "
                                        "that prices recomputation: the recompute budget and "
                                        "the planner's roofline fit (default: the H200's "
                                        "probe ceilings alone)"})
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
    max_waiting_requests: int | None = field(
        default=None, metadata={"help": "bound on queued requests (server back-pressure)"})
    long_prefill_token_threshold: int | None = field(
        default=None, metadata={"help": "a prompt's chunk per step at most, so the decodes "
                                        "that share the step wait less (0: no cap; default: "
                                        f"{DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD} with chunked "
                                        "prefill, 0 in the offline LLM)"})
    max_num_partial_prefills: int = field(
        default=1, metadata={"help": "prefills that may stop part-way in one step"})

    def create_engine_config(self) -> EngineConfig:
        model_config, _ = resolve_model_config(self.model, self.load_format)
        max_len = self.max_model_len or model_config.max_position_embeddings
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
        )
        cache = CacheConfig(
            block_size=self.block_size,
            layers_per_block=self.layers_per_block,
            gpu_memory_utilization=self.gpu_memory_utilization,
            kv_cache_gb=self.kv_cache_gb,
            swap_space_gb=self.swap_space,
            num_gpu_blocks=self.num_gpu_blocks,
            num_host_blocks=self.num_host_blocks,
        )
        return EngineConfig(
            model=self.model, model_config=model_config, cache=cache, scheduler=sched,
            kv_policy=self.kv_policy, dtype=self.dtype,
            policy_options=PolicyOptions(
                uncached_ratio=self.ellm_uncached_ratio,
                max_uncached_ratio=self.ellm_max_uncached_ratio,
                max_recompute_tokens=self.ellm_max_recompute_tokens or self._recompute_cap(sched),
                recompute_budget=_budget_rule(self.ellm_recompute_budget),
                prefix_host_groups=self._host_groups(model_config, cache),
                prefix_copy_window=self.ellm_copy_window),
            device=self.device,
            load_format=self.load_format, tokenizer=self.tokenizer, seed=self.seed,
            attention_backend=self.attention_backend, enforce_eager=self.enforce_eager,
            max_graph_batch_size=self.max_graph_batch_size,
            piecewise_graphs=self.piecewise_graphs, overlap_swap=self.overlap_swap,
            served_model_name=self.served_model_name,
        )

    def _long_prefill_threshold(self) -> int:
        if self.long_prefill_token_threshold is not None:
            return self.long_prefill_token_threshold
        return DEFAULT_LONG_PREFILL_TOKEN_THRESHOLD if self.enable_chunked_prefill else 0

    def _host_groups(self, mc: ModelConfig, cache: CacheConfig) -> int:
        rule = _host_groups_rule(self.ellm_host_groups)
        if rule != "auto":
            return int(rule)
        if self.kv_policy != "ellm":
            return 0
        from kvtier.costmodel.hardware import get_hardware
        from kvtier.planner.layer_overlap import choose_host_groups

        return choose_host_groups(mc, get_hardware("h200"), cache.layers_in_block(mc.num_layers),
                                  block_size=cache.block_size).host_groups

    def _recompute_cap(self, sched: SchedulerConfig) -> int:
        """ellm's default max_recompute_tokens (it sizes the recompute scratch): half the
        step's token budget for a fixed, planned or explicit budget; 256 for the priced
        budgets of on-demand drops, which stay under the ridge point (H200 180 tokens a
        step, A100 161)."""
        priced = _budget_rule(self.ellm_recompute_budget) in ("auto", "ridge", "cost")
        if priced and self.ellm_uncached_ratio is None and not self.ellm_planner:
            return min(256, sched.max_num_batched_tokens // 2)
        return sched.max_num_batched_tokens // 2

    # ---- argparse ----------------------------------------------------------------------
    @classmethod
    def add_cli_args(cls, parser: argparse.ArgumentParser, positional_model: bool = True) -> None:
        for f in fields(cls):
            if f.name == "model":
                if positional_model:
                    parser.add_argument("model", help=f.metadata["help"])
                else:
                    parser.add_argument("--model", required=True, help=f.metadata["help"])
                continue
            flag = "--" + f.name.replace("_", "-")
            default = f.default if f.default is not MISSING else None
            if "bool" in str(f.type):  # bool, or bool | None (unset: the engine decides)
                parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                    default=default, help=f.metadata["help"])
            else:
                parser.add_argument(flag, type=_arg_type(f.type), default=default,
                                    help=f.metadata["help"])
        parser.add_argument("--num-gpu-blocks-override", dest="num_gpu_blocks", type=int,
                            help="vLLM's name for --num-gpu-blocks")
        parser.add_argument("--ellm-planner-calibration", dest="ellm_calibration",
                            help=argparse.SUPPRESS)  # its name before it priced the budget too

    @classmethod
    def from_cli_args(cls, ns: argparse.Namespace) -> EngineArgs:
        kw: dict[str, Any] = {f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)}
        return cls(**kw)


def _host_groups_rule(rule: str | int) -> str | int:
    """`--ellm-host-groups`: auto, or a group count given as digits."""
    if isinstance(rule, int) or rule == "auto":
        return rule
    if not rule.isdigit():
        raise ConfigError(f"--ellm-host-groups must be auto or a count >= 0, got {rule!r}")
    return int(rule)


def _budget_rule(rule: str | int) -> str | int:
    """`--ellm-recompute-budget`: a rule's name, or a token count given as digits."""
    return int(rule) if isinstance(rule, str) and rule.isdigit() else rule


def _arg_type(annotation: Any):
    text = str(annotation)
    if "float" in text:
        return float
    if "int" in text:
        return int
    return str
