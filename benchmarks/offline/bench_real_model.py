"""A real instruct model served end to end: SmolLM2-135M-Instruct (tests/real_model.py) on
ShareGPT's first questions through its own chat template.

Two figures, one engine:
- latency: requests one at a time (batch 1): TTFT, TPOT and end-to-end per request;
- throughput: every request at once (vLLM's benchmark_throughput): requests/s, output and
  total tokens/s, with each request's TTFT / TPOT / end-to-end (queueing included).
The model stops where it stops (its own end-of-turn), capped at the ShareGPT reply's length;
`--ignore-eos` generates each cap exactly, as the random-weight rows do.

  python -m tests.real_model --out DIR                     # once: the HF directory
  python -m benchmarks.offline.bench_real_model --model DIR --out RESULT.json

Where ShareGPT's package is missing (the GPU machine), prepare the workload beside it first:
`--save-workload W.json --prepare-only` here, `--workload W.json` there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks.common import write_result
from kvtier import LLM, SamplingParams
from kvtier.bench.request import BenchRequest, LengthLimits
from kvtier.bench.sharegpt import load_sharegpt_pairs, sample_sharegpt
from kvtier.tokenizer import load_tokenizer


class ChatEncoder:
    """Encodes a ShareGPT question as the user turn of a chat, as a chat server would."""

    def __init__(self, tokenizer: Any):
        self._tok = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tok.apply_chat_template([{"role": "user", "content": text}])


def percentiles(xs: list[float]) -> dict[str, float] | None:
    if not xs:
        return None
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"mean": statistics.fmean(xs), "p50": pick(0.5), "p90": pick(0.9), "p99": pick(0.99)}


def request_latencies(outs: list) -> dict[str, Any]:
    """TTFT, TPOT (after the first token) and end to end, in ms, over the given outputs."""
    ttft, tpot, e2e = [], [], []
    for o in outs:
        m, n = o.metrics, len(o.outputs[0].token_ids)
        ttft.append(1e3 * (m.first_token_time - m.arrival_time))
        e2e.append(1e3 * (m.finished_time - m.arrival_time))
        if n > 1:
            tpot.append(1e3 * (m.finished_time - m.first_token_time) / (n - 1))
    return {"ttft_ms": percentiles(ttft), "tpot_ms": percentiles(tpot), "e2e_ms": percentiles(e2e)}


def params_for(max_tokens: int, ignore_eos: bool) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)


def latency_run(llm: LLM, requests: list, ignore_eos: bool) -> dict[str, Any]:
    outs = [llm.generate([{"prompt_token_ids": list(r.prompt_token_ids)}],
                         params_for(r.output_len, ignore_eos))[0] for r in requests]
    return {"num_requests": len(outs),
            "output_tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            **request_latencies(outs)}


def throughput_run(llm: LLM, requests: list, ignore_eos: bool) -> dict[str, Any]:
    prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
    params = [params_for(r.output_len, ignore_eos) for r in requests]
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params)
    elapsed = time.perf_counter() - t0
    n_in = sum(len(r.prompt_token_ids) for r in requests)
    n_out = sum(len(o.outputs[0].token_ids) for o in outs)
    stopped = sum(o.outputs[0].finish_reason == "stop" for o in outs)
    stats = llm.engine.get_stats()
    return {"num_requests": len(outs), "prompt_tokens": n_in, "output_tokens": n_out,
            "output_tokens_cap": sum(r.output_len for r in requests),
            "stopped_by_model": stopped, "elapsed_s": elapsed,
            "requests_per_s": len(outs) / elapsed, "output_tokens_per_s": n_out / elapsed,
            "total_tokens_per_s": (n_in + n_out) / elapsed,
            "num_preemptions": stats.num_preemptions_total, **request_latencies(outs)}


def chat_workload(args: argparse.Namespace) -> list[BenchRequest]:
    """ShareGPT's questions as chat turns of this model (seeded sample, vLLM's length filter
    capped at max_model_len), or the requests of a workload saved earlier."""
    if args.workload is not None:
        saved = json.loads(Path(args.workload).read_text())
        return [BenchRequest(tuple(p), n) for p, n in saved["requests"]]
    tokenizer = load_tokenizer(args.model, None, 0)
    limits = LengthLimits(max_total_len=args.max_model_len)  # vLLM's filter at 2048
    return sample_sharegpt(load_sharegpt_pairs(), ChatEncoder(tokenizer),
                           args.num_prompts + args.latency_requests, args.seed, limits,
                           fixed_output_len=args.max_output_len)


def save_workload(path: str, requests: list[BenchRequest], args: argparse.Namespace) -> None:
    Path(path).write_text(json.dumps({
        "source": "sharegpt first questions through the model's chat template",
        "seed": args.seed, "max_output_len": args.max_output_len,
        "requests": [[list(r.prompt_token_ids), r.output_len] for r in requests]}))
    print(f"wrote {path}: {len(requests)} requests")


def build_llm(args: argparse.Namespace) -> LLM:
    options: dict[str, Any] = dict(dtype=args.dtype, device=args.device,
                                   max_model_len=args.max_model_len, kv_policy=args.kv_policy)
    if args.kv_cache_gb is not None:
        options.update(kv_cache_gb=args.kv_cache_gb, swap_space=args.kv_cache_gb)
    if args.max_num_seqs is not None:
        options["max_num_seqs"] = args.max_num_seqs
    return LLM(str(args.model), **options)


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True, help="the SmolLM2 HF directory")
    ap.add_argument("--out", help="result JSON")
    ap.add_argument("--workload", help="requests saved by --save-workload (else ShareGPT)")
    ap.add_argument("--save-workload", help="write the requests here (token ids and caps)")
    ap.add_argument("--prepare-only", action="store_true", help="with --save-workload: stop")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--latency-requests", type=int, default=20)
    ap.add_argument("--max-output-len", type=int, default=None,
                    help="cap every request's output at this (default: the reply's length)")
    ap.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=False)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--kv-policy", default="recompute")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=None)
    ap.add_argument("--kv-cache-gb", type=float, default=None,
                    help="device (and host) KV pool size; default: the engine's")
    ap.add_argument("--seed", type=int, default=0, help="ShareGPT shuffle")
    args = ap.parse_args()
    if not (args.out or (args.save_workload and args.prepare_only)):
        ap.error("--out is required (unless --save-workload with --prepare-only)")
    return args


def main() -> None:
    args = parse_args()
    requests = chat_workload(args)
    if len(requests) <= args.latency_requests:
        raise SystemExit(f"{len(requests)} requests: need more than --latency-requests")
    if args.save_workload:
        save_workload(args.save_workload, requests, args)
        if args.prepare_only:
            return
    t0 = time.perf_counter()
    llm = build_llm(args)
    startup_s = time.perf_counter() - t0
    llm.generate([{"prompt_token_ids": list(requests[0].prompt_token_ids)}], params_for(8, True))
    latency = latency_run(llm, requests[:args.latency_requests], args.ignore_eos)
    throughput = throughput_run(llm, requests[args.latency_requests:], args.ignore_eos)
    llm.engine.check_integrity()
    stamp = args.model / "kvtier-real-model.json"
    result = {
        "model": json.loads(stamp.read_text()) if stamp.is_file() else str(args.model),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "startup_s": startup_s, "latency_batch1": latency, "throughput": throughput,
        "engine": {"device": str(llm.engine.config.device), "dtype": llm.engine.config.dtype,
                   "max_num_seqs": llm.engine.config.scheduler.max_num_seqs,
                   "max_num_batched_tokens": llm.engine.config.scheduler.max_num_batched_tokens,
                   "gpu_blocks_total": llm.engine.get_stats().gpu_blocks_total},
    }
    print(json.dumps(result, indent=1))
    write_result(args.out, result)


if __name__ == "__main__":
    main()
