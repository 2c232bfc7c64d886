"""Tokenize a ShareGPT sample once, here, into a compact JSON the GPU machine can read
(the dataset itself is ~125 MB and the device machine has no network).

  python -m benchmarks.prepare_workload --model llama-3.1-8b --num-prompts 1000 \
      --out .carry/sharegpt_llama31_1000.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvtier.bench.sharegpt import load_sharegpt_pairs, sample_sharegpt
from kvtier.config import ModelConfig
from kvtier.model.loader import resolve_model_config
from kvtier.tokenizer import load_tokenizer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    mc, ckpt = resolve_model_config(args.model, "auto")
    assert isinstance(mc, ModelConfig)
    tok = load_tokenizer(ckpt, None, mc.vocab_size)
    reqs = sample_sharegpt(load_sharegpt_pairs(), tok, args.num_prompts, args.seed)
    payload = {"dataset": "sharegpt-v3-unfiltered-cleaned (first human/gpt turn)",
               "model": args.model, "seed": args.seed,
               "requests": [[list(r.prompt_token_ids), r.output_len] for r in reqs]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(payload, separators=(",", ":")))
    n_in = sum(len(r.prompt_token_ids) for r in reqs)
    n_out = sum(r.output_len for r in reqs)
    print(f"{len(reqs)} requests, {n_in} prompt + {n_out} output tokens -> {args.out}")


if __name__ == "__main__":
    main()
