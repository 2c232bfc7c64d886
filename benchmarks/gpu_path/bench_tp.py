"""Tensor parallelism on the GPUs of one host (issue 28): at each TP degree, the decode step
against the N-GPU HBM roofline with the step's collectives timed apart, offline ShareGPT
throughput, and start-up time. Dummy weights, bf16.

    python -m benchmarks.gpu_path.bench_tp --model llama-3.1-8b --tp 1,2,4 \
        --parts startup,decode,collectives,offline --workload .carry/sharegpt_llama31_1000.json \
        --out results/gpu_path/tp_h200_llama31.json

Per TP degree N (skipped where fewer than N GPUs exist):
  startup      wall seconds of `LLMEngine.from_engine_args` (spawning N-1 workers, each
               loading its shard, sizing pools, capturing graphs)
  decode       median `engine.step()` of B requests at context C (synchronous steps), and the
               roofline of one GPU's share: its weights (the shard's) and its KV heads' bytes
               over the measured HBM bandwidth (the N GPUs read in parallel)
  collectives  the same step's collectives alone on N processes (2 all-reduces of [B, hidden]
               a layer, the embedding's, the logits' all-gather), and the cost model's price
  offline      output tokens/s over the workload (the offline LLM's batch defaults)
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks.common import H200_HBM_BYTES_PER_S, environment
from kvtier import SamplingParams
from kvtier.config import ModelConfig
from kvtier.distributed.sharding import TPShard
from kvtier.engine.args import EngineArgs
from kvtier.engine.batch_defaults import offline_batch_defaults
from kvtier.engine.llm_engine import LLMEngine
from kvtier.model.loader import resolve_model_config

GREEDY = SamplingParams(temperature=0.0, max_tokens=4096, ignore_eos=True, detokenize=False,
                        output_kind="final_only")


def per_gpu_bytes(mc: ModelConfig, tp: int, batch: int, context: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one GPU reads in a decode step at TP `tp` (bf16). The
    embedding is gathered, not read; the LM head's rows and the KV heads are the shard's."""
    s = TPShard(mc, 0, tp)
    h, d = mc.hidden_size, mc.head_dim
    q, kv = s.num_heads * d, s.num_kv_heads * d
    layer = h * (q + 2 * kv) + q * h + 3 * h * s.intermediate + 2 * h
    weights = (mc.num_layers * layer + s.vocab_per_rank * h + h) * 2
    return weights, batch * context * 2 * mc.num_layers * kv * 2


def engine_args(model: str, tp: int, **kw) -> EngineArgs:
    return EngineArgs(model=model, load_format="dummy", dtype="bfloat16", swap_space=1,
                      tensor_parallel_size=tp, **kw)


def started(args: EngineArgs) -> tuple[LLMEngine, float]:
    t0 = time.perf_counter()
    engine = LLMEngine.from_engine_args(args)
    return engine, time.perf_counter() - t0


def decode_steps(engine: LLMEngine, batch: int, context: int, iters: int) -> dict:
    ids = [f"b{batch}_{i}" for i in range(batch)]
    for i, rid in enumerate(ids):
        engine.add_request(rid, [1 + (i * 7 + k) % 30000 for k in range(context)], GREEDY)
    while engine.get_stats().num_waiting or any(
            r.num_computed_tokens < r.num_prompt_tokens for r in engine.scheduler.running):
        engine.step()
    for _ in range(5):
        engine.step()
    walls = []
    for _ in range(iters):
        t0 = time.perf_counter()
        engine.step()
        walls.append(time.perf_counter() - t0)
    engine.abort_request(ids)
    return {"step_ms": statistics.median(walls) * 1e3, "min_ms": min(walls) * 1e3}


def run_decode(model: str, tp: int, batches: list[int], context: int, kv_gb: float,
               iters: int, eager: bool) -> dict:
    args = engine_args(model, tp, max_model_len=context + 256, max_num_seqs=max(batches),
                       kv_cache_gb=kv_gb, enforce_eager=eager, async_scheduling=False)
    engine, startup = started(args)
    mc = engine.model_config
    rows = []
    for b in batches:
        row = decode_steps(engine, b, context, iters)
        # the timed steps' mean context: the prompt, the prefill's token, 5 warm-up steps
        w, kv = per_gpu_bytes(mc, tp, b, context + 6 + iters // 2)
        roof = (w + kv) / H200_HBM_BYTES_PER_S
        rows.append({"batch": b, "context": context, **row, "roofline_ms": roof * 1e3,
                     "weight_bytes_per_gpu": w, "kv_bytes_per_gpu": kv,
                     "fraction_of_roofline": roof / (row["step_ms"] / 1e3)})
        print(f"tp={tp} batch={b}: {row['step_ms']:.2f} ms, roofline {roof * 1e3:.2f} ms",
              flush=True)
    engine.close()
    return {"startup_s": startup, "rows": rows}


def _step_collectives(group, x: torch.Tensor, logits: torch.Tensor, layers: int) -> None:
    """A decode step's collectives: two all-reduces a layer, the embedding's, the logits'
    all-gather (what kvtier/distributed/layers.py runs)."""
    for _ in range(2 * layers + 1):
        group.all_reduce(x)
    group.all_gather_rows(logits)


def _collectives_worker(rank: int, tp: int, port: int, shapes: list[tuple[int, int, int]],
                        iters: int, out: dict) -> None:
    """Times each batch's decode-step collectives on rank `rank` (rank 0 reports)."""
    from kvtier.distributed.parallel_state import TPGroup

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")  # CPU: a dry run
    if cuda:
        torch.cuda.set_device(dev)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    group = TPGroup(rank, tp, port, dev)
    results = {}
    for batch, hidden, vocab_shard, layers in shapes:
        x = torch.zeros(batch, hidden, dtype=torch.bfloat16, device=dev)
        logits = torch.zeros(batch, vocab_shard, dtype=torch.bfloat16, device=dev)

        for _ in range(3):
            _step_collectives(group, x, logits, layers)
        sync()
        walls = []
        for _ in range(iters):
            t0 = time.perf_counter()
            _step_collectives(group, x, logits, layers)
            sync()
            walls.append(time.perf_counter() - t0)
        results[batch] = statistics.median(walls) * 1e3
    if rank == 0:
        out.update(results)
    group.destroy()


def run_collectives(mc: ModelConfig, tp: int, batches: list[int], iters: int) -> dict:
    import torch.multiprocessing as mp

    from kvtier.costmodel import CostModel, CostModelConfig, get_hardware
    from kvtier.costmodel.operators import allreduce, logits_gather
    from kvtier.distributed.parallel_state import free_port

    s = TPShard(mc, 0, tp)
    shapes = [(b, mc.hidden_size, s.vocab_per_rank, mc.num_layers) for b in batches]
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_collectives_worker, args=(tp, free_port(), shapes, iters, out),
                           nprocs=tp, start_method="spawn")
        measured = dict(out)
    cm = CostModel(mc, get_hardware("h200"), None,
                   CostModelConfig(max_num_seqs=max(batches), block_bytes=1 << 20, num_gpus=tp))
    tm, sh = cm.timer, cm.shapes
    return {str(b): {"measured_ms": measured[b],
                     "cost_model_ms": ((2 * mc.num_layers + 1) * tm.allreduce(allreduce(sh, b))
                                       + tm.allgather(logits_gather(sh, b))) * 1e3}
            for b in batches}


def run_offline(model: str, tp: int, workload: str, num_prompts: int) -> dict:
    reqs = json.loads(Path(workload).read_text())["requests"][:num_prompts]
    opts = {"long_prefill_token_threshold": 0, **offline_batch_defaults({})}
    engine, startup = started(engine_args(model, tp, max_model_len=4096, **opts))
    engine.add_request("warm", reqs[0][0], SamplingParams(temperature=0.0, max_tokens=8,
                                                          ignore_eos=True, detokenize=False))
    while engine.has_unfinished_requests():
        engine.step()
    for i, (prompt, out_len) in enumerate(reqs):
        engine.add_request(str(i), prompt, SamplingParams(
            temperature=0.0, max_tokens=out_len, ignore_eos=True, detokenize=False,
            output_kind="final_only"))
    n_out, t0 = 0, time.perf_counter()
    while engine.has_unfinished_requests():
        n_out += sum(len(o.outputs[0].token_ids) for o in engine.step())
    elapsed = time.perf_counter() - t0
    engine.close()
    return {"startup_s": startup, "num_requests": len(reqs), "output_tokens": n_out,
            "elapsed_s": elapsed, "output_tokens_per_s": n_out / elapsed, "options": opts}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--tp", default="1,2,4", help="comma-separated TP degrees")
    ap.add_argument("--parts", default="decode,collectives,offline",
                    help="decode (with startup), collectives, offline")
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--kv-cache-gb", type=float, default=30.0, help="device KV pool per GPU")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
    ap.add_argument("--workload", default=None, help="prepared ShareGPT JSON (offline part)")
    ap.add_argument("--num-prompts", type=int, default=1000)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    parts = set(args.parts.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    mc, _ = resolve_model_config(args.model, "dummy")
    gpus = torch.cuda.device_count()
    result: dict = {**environment(), "model": args.model, "gpus": gpus,
                    "gpu_names": [torch.cuda.get_device_name(i) for i in range(gpus)],
                    "hbm_bytes_per_s": H200_HBM_BYTES_PER_S, "options": vars(args), "tp": {}}
    for tp in [int(t) for t in args.tp.split(",")]:
        row: dict = {}
        if tp > gpus:
            row["skipped"] = f"needs {tp} GPUs, {gpus} here"
        else:
            if "decode" in parts:
                row["decode"] = run_decode(args.model, tp, batches, args.context,
                                           args.kv_cache_gb, args.iters, args.enforce_eager)
            if "collectives" in parts and tp > 1:
                row["collectives"] = run_collectives(mc, tp, batches, args.iters)
            if "offline" in parts and args.workload:
                row["offline"] = run_offline(args.model, tp, args.workload, args.num_prompts)
        result["tp"][str(tp)] = row
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))  # after each degree
    print(json.dumps({k: v for k, v in result["tp"].items()}, indent=1)[:3000])


if __name__ == "__main__":
    main()
