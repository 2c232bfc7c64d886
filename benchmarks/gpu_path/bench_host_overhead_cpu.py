"""Host (CPU) time of one engine decode step at 256 and 512 running requests, on the CPU.

On the GPU a decode step is a CUDA-graph replay; what is left on the host is Python:
`Scheduler.schedule` (+ `KVCacheManager.allocate_slots`), `ModelRunner.prepare_batch`
(host batch, block tables), the sampler's host part, `Scheduler.update` and
`LLMEngine.make_outputs`. This benchmark keeps all of those real and replaces only the forward
pass (`ModelRunner.forward_logits`) by a constant logits tensor of a few columns, so every
sampling request draws the same token at no device cost and each step times host work only.

The model is the tiny dummy Llama with 32 layers (8 layer groups at layers_per_block 4, as
llama-3.1-8b has); the KV manager gets a pool big enough for every request while the
runner's (never read) device pool is one block, so no memory is spent on KV.

  python -m benchmarks.gpu_path.bench_host_overhead_cpu --label before \
      --out results/gpu_path/host_overhead_cpu.json
  # ... change the code ...
  python -m benchmarks.gpu_path.bench_host_overhead_cpu --label after \
      --out results/gpu_path/host_overhead_cpu.json

Results of every label are kept in the one JSON (a later run replaces its own label only).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import environment, write_result
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.model.presets import PRESETS
from kvtier.runner.host_batch import HostBatch
from kvtier.runner.model_runner import ModelRunner
from kvtier.sampling_params import SamplingParams
from kvtier.tokenizer import load_tokenizer

_MODEL = "tiny-llama-host-bench"
_TOKEN = 7  # every sampled token (ignore_eos: it never stops a request)


def build_engine(num_reqs: int, max_model_len: int, num_layers: int, block_size: int,
                 layers_per_block: int) -> LLMEngine:
    PRESETS[_MODEL] = {**PRESETS["tiny-llama"], "num_hidden_layers": num_layers}
    args = EngineArgs(model=_MODEL, load_format="dummy", device="cpu", dtype="float32",
                      max_model_len=max_model_len, max_num_seqs=num_reqs,
                      max_num_batched_tokens=8192, block_size=block_size,
                      layers_per_block=layers_per_block, swap_space=0, attention_backend="torch")
    config = args.create_engine_config()
    tokenizer = load_tokenizer(None, None, config.model_config.vocab_size)
    runner = ModelRunner(config, None, torch.device("cpu"), torch.float32)
    runner.allocate_kv(1, 0)  # never read: the forward pass is faked below
    num_gpu = num_reqs * cdiv(max_model_len, block_size) * runner.num_groups
    kv = KVCacheManager(num_groups=runner.num_groups, block_size=block_size,
                        num_gpu_blocks=num_gpu, num_host_blocks=0)
    fake_forward(runner, num_reqs)
    return LLMEngine(config, runner, tokenizer, kv, block_bytes=0)


def fake_forward(runner: ModelRunner, max_rows: int) -> None:
    """`forward_logits` returns rows of a constant [*, 8] tensor whose argmax is _TOKEN."""
    logits = torch.zeros(max_rows, 8)
    logits[:, _TOKEN] = 1.0

    def _logits(batch: HostBatch, external=None, extra_rows=None) -> torch.Tensor | None:
        n = len(batch.logits_idx) + (0 if extra_rows is None else len(extra_rows))
        return logits[:n].clone() if n else None

    runner.forward_logits = _logits  # type: ignore[method-assign]


def run_case(num_reqs: int, output_kind: str, opts) -> dict:
    # The first requests decode while the last ones prefill (8192 tokens a step).
    steps = opts.warmup + opts.steps + cdiv(num_reqs * opts.context, 8192) + opts.block_size
    max_len = opts.context + steps + opts.block_size
    engine = build_engine(num_reqs, max_len, opts.num_layers, opts.block_size,
                          opts.layers_per_block)
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=steps,
                            ignore_eos=True, detokenize=False, output_kind=output_kind)
    for i in range(num_reqs):
        prompt = rng.integers(10, 4000, size=opts.context).tolist()
        engine.add_request(str(i), prompt, params)
    sched = engine.scheduler
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                               for r in sched.running):
        engine.step()  # prefills (the faked forward makes them cheap too)
    assert len(sched.running) == num_reqs
    for _ in range(opts.warmup):
        engine.step()
    # Whole steps, as the engine runs them.
    walls = []
    for _ in range(opts.steps // 2):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
        if opts.check:
            engine.check_integrity()
    # The same steps again, phase by phase (LLMEngine.step's body, timed in between).
    phases: dict[str, list[float]] = {k: [] for k in ("schedule", "execute", "update",
                                                      "process")}
    for _ in range(opts.steps - opts.steps // 2):
        t0 = time.perf_counter()
        plan = sched.schedule()
        t1 = time.perf_counter()
        result = engine.executor.execute(plan)
        t2 = time.perf_counter()
        touched = sched.update(plan, result)
        t3 = time.perf_counter()
        engine.make_outputs(touched, result)
        t4 = time.perf_counter()
        for k, a, b in (("schedule", t0, t1), ("execute", t1, t2), ("update", t2, t3),
                        ("process", t3, t4)):
            phases[k].append(b - a)
        assert len(plan.scheduled) == num_reqs and plan.num_scheduled_tokens == num_reqs, (
            len(plan.scheduled), plan.num_scheduled_tokens)
    assert len(sched.running) == num_reqs, "a request finished inside the timed window"
    out = {
        "step_ms_median": 1e3 * statistics.median(walls),
        "step_ms_p10": 1e3 * float(np.percentile(walls, 10)),
        "step_ms_p90": 1e3 * float(np.percentile(walls, 90)),
        "phase_ms_median": {k: 1e3 * statistics.median(v) for k, v in phases.items()},
    }
    engine.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--label", required=True, help="e.g. before / after")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reqs", type=int, nargs="+", default=[256, 512])
    ap.add_argument("--kinds", nargs="+", default=["final_only", "cumulative"])
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--num-layers", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--layers-per-block", type=int, default=4)
    ap.add_argument("--check", action="store_true", help="check_integrity after timed steps")
    opts = ap.parse_args()
    torch.set_num_threads(1)
    results = {}
    for kind in opts.kinds:
        for n in opts.reqs:
            r = run_case(n, kind, opts)
            results[f"{kind}/{n}"] = r
            print(f"{opts.label:>8} {kind:>10} {n:4d} reqs: {r['step_ms_median']:.3f} ms/step  "
                  + " ".join(f"{k}={v:.3f}" for k, v in r["phase_ms_median"].items()))
    path = Path(opts.out)
    prev = json.loads(path.read_text()) if path.exists() else {}
    runs = prev.get("runs", {})
    runs[opts.label] = {"environment": environment(), "options": vars(opts), "results": results}
    summary = {}
    if "before" in runs and "after" in runs:
        for key, b in runs["before"]["results"].items():
            a = runs["after"]["results"].get(key)
            if a is not None:
                summary[key] = {"before_ms": round(b["step_ms_median"], 3),
                                "after_ms": round(a["step_ms_median"], 3),
                                "speedup": round(b["step_ms_median"] / a["step_ms_median"], 2)}
    write_result(path, {"runs": runs, "summary": summary})


if __name__ == "__main__":
    main()
