"""`kvtier generate | serve | bench | profile | demo`."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from kvtier.config import ConfigError
from kvtier.sampling_params import InvalidRequestError


def _add_generate(sub) -> None:
    from kvtier.engine.args import EngineArgs

    p = sub.add_parser("generate", help="generate text for one or more prompts")
    EngineArgs.add_cli_args(p)
    p.add_argument("prompts", nargs="+", help="prompt text(s)")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--sampling-seed", type=int, default=None)
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--stop", action="append", default=[])
    p.add_argument("--json", action="store_true", help="print JSON lines")
    p.set_defaults(func=_run_generate)


def _run_generate(args: argparse.Namespace) -> int:
    from kvtier.engine.args import EngineArgs
    from kvtier.entrypoints.llm import LLM
    from kvtier.sampling_params import SamplingParams

    eargs = EngineArgs.from_cli_args(args)
    llm = LLM(**vars(eargs))
    params = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
        top_k=args.top_k, seed=args.sampling_seed, ignore_eos=args.ignore_eos, stop=args.stop,
    )
    t0 = time.perf_counter()
    outs = llm.generate(args.prompts, params)
    dt = time.perf_counter() - t0
    for o in outs:
        c = o.outputs[0]
        if args.json:
            print(json.dumps({"prompt": o.prompt, "text": c.text, "token_ids": c.token_ids,
                              "finish_reason": c.finish_reason}))
        else:
            print(f"--- {o.prompt!r}\n{c.text}\n[{len(c.token_ids)} tokens, {c.finish_reason}]")
    n = sum(len(o.outputs[0].token_ids) for o in outs)
    print(f"{n} tokens in {dt:.2f} s ({n / dt:.1f} tok/s)", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    from kvtier.bench.cli import add_bench_parser
    from kvtier.profiler.calibrate import add_profile_parser
    from kvtier.server.cli import add_serve_parser

    parser = argparse.ArgumentParser(prog="kvtier", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_generate(sub)
    add_serve_parser(sub)
    add_bench_parser(sub)
    add_profile_parser(sub)
    demo = sub.add_parser("demo", help="`make run`: the memory systems compared on CPU, tiny "
                                       "model (kvtier.bench.cli.demo_argv)")
    demo.set_defaults(func=_run_demo)
    return parser


def _run_demo(args: argparse.Namespace) -> int:
    from kvtier.bench.cli import demo_main

    return int(demo_main() or 0)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except (ConfigError, InvalidRequestError) as e:
        print(f"kvtier: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
