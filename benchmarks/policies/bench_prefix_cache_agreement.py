"""Prefix caching in bf16 on the GPU: greedy agreement of caching on against off, per policy.

Exact in fp32 (tests/engine/test_prefix_cache_policies*.py; fp32 here is the control,
expected identical); in bf16 a cache hit's KV was computed in another request's batch, and
the hitting request's own tokens then run in a smaller batch, so rounding differs. Per
policy (recompute, swap, eLLM, HCache, each under memory pressure), on documents each asked
several questions (most prompt tokens a hit): the fraction of generated tokens equal to the
uncached run's, sequences identical, the mean first divergence, the largest |logprob
difference| over the top-5 tokens before it (bench_bf16_agreement's measures), and the hit
rate.

  python -m benchmarks.policies.bench_prefix_cache_agreement --out results/policies/prefix_cache_agreement_h200.json
"""

from __future__ import annotations

import argparse
import random
import tempfile

from benchmarks.common import write_result
from benchmarks.policies.bench_bf16_agreement import POLICIES, compare, save_model
from kvtier import LLM, SamplingParams


def shared_prompts(num_docs: int, questions: int, seed: int = 0) -> list[list[int]]:
    """`num_docs` documents of 300-600 tokens, each followed by `questions` questions."""
    rng = random.Random(seed)
    docs = [[rng.randrange(3, 4096) for _ in range(rng.randrange(300, 600))]
            for _ in range(num_docs)]
    return [doc + [rng.randrange(3, 4096) for _ in range(rng.randrange(10, 40))]
            for _ in range(questions) for doc in docs]


def run(path: str, dtype: str, prompts: list[list[int]], max_tokens: int, cache: bool,
        **options):
    llm = LLM(path, dtype=dtype, max_model_len=1024, layers_per_block=4, block_size=16,
              max_num_seqs=64, max_num_batched_tokens=1024, enable_prefix_caching=cache,
              **({"kv_cache_gb": 1.0} if "num_gpu_blocks" not in options else {}), **options)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    stats = llm.engine.get_stats()
    pc = llm.engine.kv_manager.prefix_cache
    hit_rate = (pc.stats.hits + pc.stats.preempted_hits) / max(
        1, pc.stats.queries + pc.stats.preempted_queries) if pc is not None else 0.0
    llm.engine.check_integrity()
    llm.engine.close()
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], stats, hit_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-docs", type=int, default=8)
    ap.add_argument("--questions", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()
    prompts = shared_prompts(args.num_docs, args.questions)
    result = {"model": "random llama (8 layers, hidden 512, GQA 8/4), ignore_eos greedy",
              "num_prompts": len(prompts), "max_tokens": args.max_tokens, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        save_model(tmp, 0)
        for dtype in ("float32", "bfloat16"):
            for name, opts in POLICIES.items():
                off, _, _ = run(tmp, dtype, prompts, args.max_tokens, False, **opts)
                on, st, hit_rate = run(tmp, dtype, prompts, args.max_tokens, True, **opts)
                row = compare(off, on)
                row.update(hit_rate=hit_rate, preemptions=st.num_preemptions_total,
                           prefix_recompute_tokens=st.num_prefix_recompute_tokens_total)
                result["rows"][f"{dtype}/{name}"] = row
                print(dtype, name, row, flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
