"""`kvtier bench`: one workload, each KV policy in turn on a fresh engine, one table.

    kvtier bench --model llama-2-13b --load-format dummy --policies recompute,swap \
        --workload sharegpt --num-prompts 3000 --arrivals paper-gamma \
        --slo-ttft 2000 --slo-tpot 100 --kv-cache-gb 8 --out runs/13b-sharegpt
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path

import numpy as np

from kvtier.bench.arrivals import PAPER_AZURE_CV, ArrivalKind, ArrivalSpec, paper_azure_gamma
from kvtier.bench.azure_trace import load_trace_csv
from kvtier.bench.data_file import DataFileError, option_of
from kvtier.bench.experiment import (
    BackendFactory,
    BenchConfig,
    SweepConfig,
    engine_backends,
    run_experiment,
)
from kvtier.bench.extras import warn_missing_extras
from kvtier.bench.leval import LEvalOrder
from kvtier.bench.metrics import Slo
from kvtier.bench.mooncake_trace import load_mooncake_trace
from kvtier.bench.mooncake_trace import trace_gaps_s as mooncake_gaps
from kvtier.bench.multiturn import MultiTurnSpec
from kvtier.bench.prepared import prepared_dataset, save_prepared
from kvtier.bench.report import write_result_dir
from kvtier.bench.runner import RunOptions
from kvtier.bench.shared_prefix import SharedPrefixSpec
from kvtier.bench.table import print_table
from kvtier.bench.workload import Dataset, Workload, WorkloadSpec, build_workload
from kvtier.bench.workload_args import add_workload_args, length_limits

log = logging.getLogger("kvtier")
ARRIVALS = ("offline", "poisson", "gamma", "paper-gamma", "trace")
DEFAULT_POLICIES = "recompute,swap"
SERVER_LABEL = "server"  # a --base-url run's label when --policies names none


class _PoliciesAction(argparse.Action):
    """Stores --policies and remembers it was given: a --base-url run labels itself with
    the one policy given, and refuses several (one server serves one policy)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        namespace.policies_given = True


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The benchmark's own options (the engine's come from EngineArgs.add_cli_args)."""
    g = p.add_argument_group("benchmark")
    g.add_argument("--policies", default=DEFAULT_POLICIES, action=_PoliciesAction,
                   help="comma-separated KV policies, run in this order; ratios are to the "
                        "first (with --base-url: at most one, the label of the server's run)")
    g.add_argument("--out", default=None, help="result directory (default runs/bench-<time>)")
    g.add_argument("--simulate", action="store_true",
                   help="run the simulator (real scheduler, cost model, virtual time)")
    g.add_argument("--gpu", default="h200", help="simulated GPU: h200 | a100-80gb")
    g.add_argument("--num-gpus", type=int, default=1, help="simulated tensor-parallel GPUs")
    g.add_argument("--calibration", default=None,
                   help="cost-model calibration JSON (kvtier profile); default: roofline")
    g.add_argument("--base-url", default=None,
                   help="drive a running `kvtier serve` over HTTP instead of an in-process "
                        "engine: one run, of the server's policy (--policies may name it)")
    g.add_argument("--slo-ttft", type=float, default=None, help="TTFT SLO in ms")
    g.add_argument("--slo-tpot", type=float, default=None, help="TPOT SLO in ms")
    g.add_argument("--warmup-requests", type=int, default=2,
                   help="short requests run before each measured run (kernel compilation)")
    g.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly each request's output length (same work per policy)")
    g.add_argument("--max-duration", type=float, default=None,
                   help="abort a run's remaining requests after this many seconds")
    g.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    g.add_argument("--gpu-monitor", action=argparse.BooleanOptionalAction, default=True,
                   help="sample GPU utilisation/power through NVML where a GPU is present")
    add_workload_args(p.add_argument_group("workload"))
    _add_arrival_args(p.add_argument_group("arrivals"))
    _add_goodput_args(p.add_argument_group("goodput"))


def _add_arrival_args(a: argparse._ArgumentGroup) -> None:
    a.add_argument("--arrivals", choices=ARRIVALS, default=None,
                   help="default: poisson with --rate, else offline; paper-gamma: the Azure "
                   "trace's gaps (mean 22.15 ms, CV 1.69), halved for ShareGPT, doubled for "
                   "L-Eval; trace: the gaps of --trace-path")
    a.add_argument("--rate", "--request-rate", type=float, default=None,
                   help="poisson/gamma: requests per second (vLLM's --request-rate: Poisson "
                   "arrivals unless --arrivals says otherwise)")
    a.add_argument("--cv", type=float, default=PAPER_AZURE_CV, help="gamma: CV of the gaps")
    a.add_argument("--rate-scale", type=float, default=1.0,
                   help="send this many times faster, same draws (the paper sweeps 0.5-3)")
    a.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most (vLLM's and SGLang's flag): one due while "
                   "they are waits on the client, and is timed from its send")
    a.add_argument("--trace-path", default=None,
                   help="Azure or BurstGPT trace CSV, or Mooncake trace JSONL, for --arrivals "
                   "trace (default: the --dataset-path of a trace workload)")


def _add_goodput_args(s: argparse._ArgumentGroup) -> None:
    s.add_argument("--goodput-sweep", action="store_true",
                   help="find each policy's goodput: highest rate with >= target inside both SLOs")
    s.add_argument("--sweep-rates", type=_floats, default=(), help="grid of rates, e.g. 1,2,4,8")
    s.add_argument("--sweep-low", type=float, default=0.5, help="bisection: lowest rate")
    s.add_argument("--sweep-high", type=float, default=64.0, help="bisection: highest rate")
    s.add_argument("--goodput-target", type=float, default=0.9)


def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    from kvtier.engine.args import EngineArgs

    p = subparsers.add_parser(
        "bench", help="benchmark KV policies side by side on a workload",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_bench_args(p)
    EngineArgs.add_cli_args(p, positional_model=False)
    p.set_defaults(func=run_bench)
    return p


def arrivals_kind(args: argparse.Namespace) -> str:
    """--arrivals, else poisson where a rate is given (vLLM's --request-rate), else offline."""
    if args.arrivals is None:
        return "offline" if args.rate is None else "poisson"
    if args.arrivals == "offline" and args.rate is not None:
        raise SystemExit("kvtier bench: --rate needs arrivals with a rate, not --arrivals offline")
    return str(args.arrivals)


def arrival_spec(args: argparse.Namespace) -> ArrivalSpec:
    kind = arrivals_kind(args)
    if kind == "offline":
        return ArrivalSpec(ArrivalKind.OFFLINE)
    if kind == "paper-gamma":
        return paper_azure_gamma(_source_dataset(args), args.rate_scale)
    if kind == "trace":
        own = args.workload in ("azure", "burstgpt", "mooncake")
        path = args.trace_path or (args.dataset_path if own else None)
        if path is None:
            raise SystemExit("kvtier bench: --arrivals trace needs --trace-path")
        gaps = tuple(float(g) for g in trace_gaps(path)[args.trace_start:])
        return ArrivalSpec(ArrivalKind.TRACE, trace_gaps_s=gaps, scale=args.rate_scale)
    if args.rate is None:
        raise SystemExit(f"kvtier bench: --arrivals {kind} needs --rate")
    cv = args.cv if kind == "gamma" else 1.0
    return ArrivalSpec(ArrivalKind(kind), rate=args.rate, cv=cv, scale=args.rate_scale)


def trace_gaps(path: str) -> np.ndarray:
    """A trace's gaps in seconds: Mooncake's JSON lines, else an Azure or BurstGPT CSV."""
    if str(path).endswith((".jsonl", ".json")):
        return mooncake_gaps(load_mooncake_trace(path))
    return load_trace_csv(path).gaps_s()


def _source_dataset(args: argparse.Namespace) -> str:
    """The dataset behind the workload: a prepared file's own, which sets the paper's gaps."""
    if args.workload == "prepared" and args.dataset_path:
        return prepared_dataset(args.dataset_path) or "prepared"
    return args.workload


def workload_spec(args: argparse.Namespace, max_model_len: int) -> WorkloadSpec:
    try:
        multiturn = MultiTurnSpec(args.multiturn_think_time, args.multiturn_min_turns,
                                  args.multiturn_max_turns)
        gsp = SharedPrefixSpec(args.gsp_num_groups, args.gsp_prompts_per_group,
                               args.gsp_system_prompt_len, args.gsp_question_len,
                               args.gsp_output_len)
    except ValueError as e:
        raise SystemExit(f"kvtier bench: {e}") from e
    num = args.num_prompts
    if num is None:
        num = gsp.num_requests if args.workload == "generated-shared-prefix" else 200
    if num < 1:  # else ShareGPT would take every conversation, L-Eval none: a run unasked for
        raise SystemExit(f"kvtier bench: --num-prompts must be >= 1, got {num}")
    return WorkloadSpec(
        dataset=Dataset(args.workload), num_requests=num, arrivals=arrival_spec(args),
        seed=args.workload_seed, path=args.dataset_path, limits=length_limits(args, max_model_len),
        input_len=args.input_len, output_len=args.output_len, range_ratio=args.range_ratio,
        max_document_tokens=args.leval_max_document_tokens, trace_start=args.trace_start,
        mooncake_block_size=args.mooncake_block_size,
        leval_order=LEvalOrder(args.leval_order), multiturn=multiturn, shared_prefix=gsp,
    )


def bench_config(args: argparse.Namespace) -> BenchConfig:
    slo = None
    if args.slo_ttft is not None or args.slo_tpot is not None:
        ms = lambda x: None if x is None else x / 1000.0  # noqa: E731
        slo = Slo(ttft_s=ms(args.slo_ttft), tpot_s=ms(args.slo_tpot))
    sweep = None
    if args.goodput_sweep:
        if slo is None:
            raise SystemExit("kvtier bench: --goodput-sweep needs --slo-ttft and/or --slo-tpot")
        if arrivals_kind(args) == "offline":
            raise SystemExit("kvtier bench: --goodput-sweep needs arrivals with a rate, not offline")
        sweep = SweepConfig(rates=tuple(args.sweep_rates), low=args.sweep_low, high=args.sweep_high,
                            target=args.goodput_target)
    return BenchConfig(
        policies=_policies(args), slo=slo, warmup_requests=args.warmup_requests,
        run=RunOptions(progress=args.progress, max_duration_s=args.max_duration,
                       max_concurrency=args.max_concurrency),
        sweep=sweep, monitor_gpu=args.gpu_monitor,
    )


def _policies(args: argparse.Namespace) -> tuple[str, ...]:
    policies = tuple(p.strip() for p in args.policies.split(",") if p.strip())
    if not getattr(args, "base_url", None):
        if not policies:
            raise SystemExit("kvtier bench: --policies is empty")
        return policies
    if not getattr(args, "policies_given", False):
        return (SERVER_LABEL,)
    if len(policies) != 1:
        raise SystemExit(
            f"kvtier bench: --base-url drives one server, which serves one policy; --policies "
            f"{args.policies!r} names {len(policies)}: give the server's policy as its label, "
            "or none (run bench once per server to compare policies)")
    return policies


def _tokenizer_and_config(engine_args):
    """The model's tokenizer and resolved config, without building an engine (no KV pools)."""
    from kvtier.model.loader import resolve_model_config
    from kvtier.tokenizer import load_tokenizer

    config = engine_args.create_engine_config()
    _, ckpt = resolve_model_config(config.model, config.load_format)
    return load_tokenizer(ckpt, config.tokenizer, config.model_config.vocab_size,
                          config.chat_template), config


def _check_policies(policies: tuple[str, ...]) -> None:
    """Fail before the first run, not after an hour of it, on a misspelt policy."""
    from kvtier.policies import policy_names

    unknown = [p for p in policies if p not in policy_names()]
    if unknown:
        raise SystemExit(f"kvtier bench: unknown policies {unknown}; known: {sorted(policy_names())}")


def _engine_backends(engine_args, ignore_eos: bool) -> BackendFactory:
    from kvtier.engine.llm_engine import LLMEngine

    def engine(policy: str) -> LLMEngine:
        return LLMEngine.from_engine_args(replace(engine_args, kv_policy=policy))

    return engine_backends(engine, ignore_eos)


def _sim_backends(engine_args, args: argparse.Namespace) -> BackendFactory:
    """Simulated engines on one virtual clock, which the runner then also uses."""
    from kvtier.sim import VirtualClock, build_sim_engine

    clock = VirtualClock()

    def engine(policy: str):
        return build_sim_engine(replace(engine_args, kv_policy=policy), args.gpu,
                                args.calibration, args.num_gpus, clock=clock)

    return engine_backends(engine, args.ignore_eos, clock)


def _http_backends(args: argparse.Namespace) -> BackendFactory:
    from kvtier.bench.http_backend import HTTPBackend

    # httpx logs every request at INFO: thousands of lines that bury the run's own.
    logging.getLogger("httpx").setLevel(logging.WARNING)

    return lambda policy: HTTPBackend(args.base_url, ignore_eos=args.ignore_eos)


def _backends(engine_args, args: argparse.Namespace) -> BackendFactory:
    if args.base_url:
        return _http_backends(args)
    if args.simulate:
        return _sim_backends(engine_args, args)
    return _engine_backends(engine_args, args.ignore_eos)


def _bench_options(args: argparse.Namespace, engine_args) -> dict:
    engine_keys = set(asdict(engine_args))
    return {k: v for k, v in vars(args).items() if k not in engine_keys and not callable(v)}


def _workload(args: argparse.Namespace, tokenizer, engine_config) -> Workload:
    """The run's workload, or an exit that says why not, naming the option of a bad file."""
    try:  # the spec too: --arrivals trace and paper-gamma read files
        spec = workload_spec(args, engine_config.scheduler.max_model_len)
        return build_workload(spec, tokenizer, engine_config.model_config.vocab_size)
    except DataFileError as e:
        option = option_of(e, {"--dataset-path": args.dataset_path, "--trace-path": args.trace_path})
        raise SystemExit(f"kvtier bench: {option + ' ' if option else ''}{e}") from e
    except (ValueError, OSError) as e:  # too few requests fit, the dataset package absent
        raise SystemExit(f"kvtier bench: {e}") from e


def run_bench(args: argparse.Namespace) -> int:
    from kvtier.engine.args import EngineArgs

    engine_args = EngineArgs.from_cli_args(args)
    config = bench_config(args)
    if not args.base_url:  # a server's run is labelled, not built, by its policy
        _check_policies(config.policies)
    warn_missing_extras(config.monitor_gpu)
    tokenizer, engine_config = _tokenizer_and_config(engine_args)
    workload = _workload(args, tokenizer, engine_config)
    spec = workload.spec
    if workload.length_report is not None and workload.length_report.num_outside:
        log.warning("kvtier bench: %s", workload.length_report.describe())
    if args.save_workload:
        save_prepared(workload.requests, args.save_workload, {"spec": spec.to_dict()})
        print(f"workload: {_describe(workload)} -> {args.save_workload}")
    if args.prepare_only:
        return 0
    results = run_experiment(workload, _backends(engine_args, args), config)
    out = Path(args.out or f"runs/bench-{datetime.now():%Y%m%d-%H%M%S}")
    command = getattr(args, "command_line", None) or shlex.join(["kvtier", *sys.argv[1:]])
    run_config = {"engine": asdict(engine_args), "bench": _bench_options(args, engine_args)}
    path = write_result_dir(out, results, workload, run_config, command)
    print_table(results, title=f"kvtier bench: {_describe(workload)}")
    print(f"results: {path}")
    return 0


def _describe(workload: Workload) -> str:
    s = workload.summary()
    rate = workload.spec.arrivals.mean_rate
    arrivals = "offline" if rate is None else f"{workload.spec.arrivals.kind.value} {rate:.3g} req/s"
    report = workload.length_report
    outside = (f", {report.num_outside} {report.action.value} to fit"
               if report and report.num_outside else "")
    return (f"{workload.spec.dataset.value}, {s['num_requests']} requests "
            f"(mean {s['mean_prompt_len']:.0f} in / {s['mean_output_len']:.0f} out{outside}), "
            f"{arrivals}")


def demo_argv() -> list[str]:
    """`make run`: tiny model on CPU, a KV pool small enough that requests get preempted;
    the systems that mark themselves for the demo (`MemorySystem.demo_order`)."""
    from kvtier.policies import demo_policies

    return [
        "--model", "tiny-llama", "--load-format", "dummy", "--device", "cpu",
        "--policies", ",".join(demo_policies()), "--workload", "sharegpt",
        "--num-prompts", "60", "--max-prompt-len", "192", "--max-total-len", "384",
        "--max-model-len", "384", "--arrivals", "gamma", "--rate", "12",
        "--cv", f"{PAPER_AZURE_CV:.4f}", "--num-gpu-blocks", "36", "--num-host-blocks", "512",
        "--slo-ttft", "1000", "--slo-tpot", "50", "--out", "runs/demo",
    ]


def _single_thread_torch() -> None:
    """The tiny model's ops are too small to split: one intra-op thread is faster, and it
    avoids OpenMP spin-wait stalls (seconds per step) when other processes share the cores."""
    import os

    import torch

    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def demo_main(argv: list[str] | None = None) -> int:
    """The default comparison (demo_argv's systems) on ShareGPT with Azure-like gamma
    arrivals."""
    logging.basicConfig(level=logging.WARNING)
    _single_thread_torch()
    parser = argparse.ArgumentParser(prog="kvtier demo")
    sub = parser.add_subparsers()
    add_bench_parser(sub)
    demo = demo_argv()
    args = parser.parse_args(["bench", *demo, *(argv or [])])
    args.command_line = shlex.join(["kvtier", "bench", *demo, *(argv or [])])
    return run_bench(args)
