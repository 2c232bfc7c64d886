"""Host cost of structured outputs a step, on this machine's CPU: what the engine thread
spends building the step's allowed-token masks (`StructuredRequests.fill`: one xgrammar
matcher a row; from 64 rows on xgrammar's threads where that has been faster, or as
`--fill` says), advancing the matchers by the sampled tokens (`SequenceGrammar.accept`), and
what the sampler's mask op costs (`kvtier.structured.mask.mask_logits`, the masks' upload
included; on the CPU's logits, or with `--device cuda` on the GPU's, timed after a
synchronize), at batch sizes 1-256 over Llama-3.1-8B's 128,256-token vocabulary (the dummy
models' BPE), for a JSON schema and a regular expression.

Each row's matcher is first advanced into a reply (different depths for different rows), so
the masks are those of a reply under way, not of its first token.

  python -m benchmarks.gpu_path.bench_structured_overhead \\
      --out results/gpu_path/structured_overhead_cpu.json
  python -m benchmarks.gpu_path.bench_structured_overhead --device cuda --out ...  # device part
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from benchmarks.common import write_result
from kvtier.core.plan import ScheduledRequest, StepPlan
from kvtier.sampling_params import SamplingParams
from kvtier.structured import backend
from kvtier.structured.fill_choice import FillChoice
from kvtier.structured.mask import mask_logits
from kvtier.structured.requests import StructuredRequests
from kvtier.tokenizer import BPETokenizer

VOCAB = 128_256  # Llama-3.1-8B's
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"type": "string"}}}, "required": ["name", "age", "tags"]}
REPLY = '{"name": "Ada Lovelace", "age": 36, "tags": ["math", "engines", "notes"]}'
FORMATS = {"json": ({"json": SCHEMA}, REPLY),
           "regex": ({"regex": r"[A-Z][a-z]+ [0-9]{4}-[0-9]{2}-[0-9]{2}"}, "Monday 2026-12-05")}


def rows_in_flight(grammars: StructuredRequests, spec: dict, reply: list[int], n: int, eos):
    """n sequences of one format, row i advanced by i % len(reply) of the reply's tokens."""
    params = SamplingParams(structured_outputs=spec)
    compiled = grammars.compile(params)
    seqs = []
    for i in range(n):
        seq = grammars.sequence(compiled, params, eos)
        for tok in reply[:i % len(reply)]:
            assert not seq.accept(tok), "the reply ended early"
        seqs.append(seq)
    return params, seqs


def median_s(fn, reps: int, device: torch.device = torch.device("cpu")) -> float:
    """Median wall seconds of fn() (on a GPU: synchronized before and after, so the
    device's work counts), after one warm-up call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    fn()
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(grammars, tok, name: str, batch: int, reps: int,
            device: torch.device = torch.device("cpu")) -> dict:
    spec, text = FORMATS[name]
    reply = tok.encode(text)
    params, seqs = rows_in_flight(grammars, spec, reply, batch, tok.eos_token_ids)
    plan = StepPlan([ScheduledRequest(str(i), [1], 10, ((),), False, True, params, 5)
                     for i in range(batch)])
    by_id = {str(i): s for i, s in enumerate(seqs)}
    fill = median_s(lambda: grammars.fill(plan, by_id.get), reps)
    masks = [sr.token_mask for sr in plan.scheduled]
    logits = torch.randn(batch, VOCAB, device=device)
    rows = list(range(batch))
    put = lambda a: torch.from_numpy(a).to(device)  # noqa: E731
    apply = median_s(lambda: mask_logits(logits.clone(), rows, masks, put), reps, device)
    clone = median_s(lambda: logits.clone(), reps, device)
    # accept: one token a row (each a fresh copy of the state, so every timed call advances)
    nxt = [reply[i % len(reply)] for i in range(batch)]
    forks = [[s.matcher.fork() for s in seqs] for _ in range(reps)]
    accept_times = []
    for copy in forks:
        t0 = time.perf_counter()
        for m, t in zip(copy, nxt):
            m.accept_token(t)
        accept_times.append(time.perf_counter() - t0)
    return {"format": name, "batch": batch, "fill_ms": fill * 1e3,
            "fill_us_per_row": fill * 1e6 / batch,
            "mask_apply_ms": max(0.0, apply - clone) * 1e3,
            "accept_us_per_row": statistics.median(accept_times) * 1e6 / batch}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", default="1,8,32,128,256")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the mask op)")
    p.add_argument("--device", default="cpu", help="where the logits are (cpu, cuda)")
    p.add_argument("--batch-fill-min-rows", type=int, default=None,
                   help="fill a step's masks on xgrammar's threads from this many rows "
                        f"(default: the engine's, {backend.BATCH_FILL_MIN_ROWS}; 1000000: never)")
    p.add_argument("--fill", choices=("auto", "threaded", "serial"), default="auto",
                   help="large steps' masks: the engine's choice by measured cost (auto), "
                        "always on xgrammar's threads, or always one row after another")
    p.add_argument("--label", default="", help="what this run measures (kept in the JSON)")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.batch_fill_min_rows is not None:
        backend.BATCH_FILL_MIN_ROWS = args.batch_fill_min_rows
    tok = BPETokenizer(VOCAB)
    t0 = time.perf_counter()
    grammars = StructuredRequests(tok, VOCAB)
    _ = grammars.backend  # the compiler over the vocabulary: once an engine
    if args.fill != "auto":
        grammars.backend.fill_choice = FillChoice(backend.BATCH_FILL_MIN_ROWS,
                                                  fixed=args.fill == "threaded")
    setup_s = time.perf_counter() - t0
    device = torch.device(args.device)
    rows = [measure(grammars, tok, name, int(b), args.reps, device)
            for name in FORMATS for b in args.batches.split(",")]
    for r in rows:
        print(f"{r['format']:>5} B={r['batch']:>3}: fill {r['fill_ms']:.3f} ms "
              f"({r['fill_us_per_row']:.1f} us/row), mask {r['mask_apply_ms']:.3f} ms, "
              f"accept {r['accept_us_per_row']:.1f} us/row")
    write_result(args.out, {"label": args.label, "vocab_size": VOCAB,
                            "backend_setup_s": setup_s, "device": args.device,
                            "torch_threads": args.threads, "reps": args.reps, "rows": rows,
                            "batch_fill_min_rows": backend.BATCH_FILL_MIN_ROWS,
                            "fill": args.fill,
                            "numpy": np.__version__})


if __name__ == "__main__":
    main()
