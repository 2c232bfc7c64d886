"""eLLM, HCache, NEO and DirectKV in bf16 vs full caching: greedy agreement and logprob gaps.

Exact in fp32 (tests); in bf16 a recomputed prefix (eLLM) or a re-projected K/V (HCache) is
computed in a different batch shape than the cached original, so rounding differs. This
measures how much: per policy, the fraction of generated tokens equal to full caching's
(position by position, up to a sequence's first divergence, and overall), and the largest
|logprob difference| over the top-5 tokens at positions before the first divergence.
fp32 on the same device is the control (expected: identical).

  python -m benchmarks.policies.bench_bf16_agreement --out bf16_agreement_h200.json
  python -m benchmarks.policies.bench_bf16_agreement --device cpu --policies neo,directkv \
      --num-prompts 16 --max-tokens 32 --out bf16_agreement_host_resident_cpu.json
                           (CPU: NEO's C++ kernel; DirectKV through its torch reference)
"""

from __future__ import annotations

import argparse
import random
import tempfile

import torch

from benchmarks.common import write_result
from kvtier import LLM, SamplingParams

POLICIES = {  # options that make each policy act on most requests
    "recompute_preempt": dict(kv_policy="recompute", num_gpu_blocks=360),
    "swap": dict(kv_policy="swap", num_gpu_blocks=360),
    "ellm_r0.5": dict(kv_policy="ellm", ellm_uncached_ratio=0.5),
    "hcache": dict(kv_policy="hcache", num_gpu_blocks=360),
    # host-resident running KV: the short pool moves decodes to the host, where NEO's CPU
    # kernel or DirectKV's zero-copy reads attend over bf16 pages (balances lifted: priced,
    # they would refuse the moves and the rows measured would be recompute's)
    "neo": dict(kv_policy="neo", num_gpu_blocks=360, num_host_blocks=4096, neo_cpu_balance=0.0),
    "directkv": dict(kv_policy="directkv", num_gpu_blocks=360, num_host_blocks=4096,
                     directkv_balance=0.0),
}


def save_model(path: str, seed: int) -> None:
    import transformers

    cfg = transformers.LlamaConfig(
        vocab_size=4096, hidden_size=512, intermediate_size=1536, num_hidden_layers=8,
        num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=2048,
        bos_token_id=1, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # wider than HF's init, so the distributions are not flat
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    model.save_pretrained(path, safe_serialization=True)


def run(path: str, device: str, dtype: str, prompts: list[list[int]], max_tokens: int,
        **options):
    llm = LLM(path, device=device, dtype=dtype, max_model_len=1024, layers_per_block=4, block_size=16,
              max_num_seqs=64, max_num_batched_tokens=1024,
              **({"kv_cache_gb": 1.0} if "num_gpu_blocks" not in options else {}), **options)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, logprobs=5)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    stats = llm.engine.get_stats()
    moved = getattr(llm.engine.scheduler.policy, "num_moved_out", None)  # host-resident only
    llm.engine.check_integrity()
    llm.engine.close()
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], stats, moved


def compare(base, other) -> dict:
    matched = total = identical = 0
    max_gap = 0.0
    first_div = []
    for (bt, blp), (ot, olp) in zip(base, other):
        n = next((i for i, (a, b) in enumerate(zip(bt, ot)) if a != b), len(bt))
        first_div.append(n)
        identical += n == len(bt)
        matched += sum(a == b for a, b in zip(bt, ot))
        total += len(bt)
        for i in range(n):
            common = set(blp[i]) & set(olp[i])
            max_gap = max([max_gap, *(abs(blp[i][t] - olp[i][t]) for t in common)])
    return {"token_agreement": matched / total, "sequences_identical": identical / len(base),
            "mean_first_divergence": sum(first_div) / len(first_div),
            "max_abs_logprob_diff_top5_before_divergence": max_gap}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--device", default="cuda", help="cuda | cpu")
    ap.add_argument("--policies", default=",".join(POLICIES), help="of " + ",".join(POLICIES))
    args = ap.parse_args()
    policies = {name: POLICIES[name] for name in args.policies.split(",")}
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 4096) for _ in range(rng.randrange(16, 200))]
               for _ in range(args.num_prompts)]
    result = {"model": "random llama (8 layers, hidden 512, GQA 8/4), ignore_eos greedy",
              "device": args.device,
              "num_prompts": args.num_prompts, "max_tokens": args.max_tokens, "rows": {}}
    with tempfile.TemporaryDirectory() as tmp:
        save_model(tmp, 0)
        for dtype in ("float32", "bfloat16"):
            base, _, _ = run(tmp, args.device, dtype, prompts, args.max_tokens)
            for name, opts in policies.items():
                got, st, moved = run(tmp, args.device, dtype, prompts, args.max_tokens, **opts)
                row = compare(base, got)
                row.update(preemptions=st.num_preemptions_total,
                           prefix_recompute_tokens=st.num_prefix_recompute_tokens_total,
                           restored_tokens=getattr(st, "num_restored_tokens_total", 0),
                           moved_to_host=moved)
                result["rows"][f"{dtype}/{name}"] = row
                print(dtype, name, row, flush=True)
    write_result(args.out, result)


if __name__ == "__main__":
    main()
