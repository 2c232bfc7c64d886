"""NEO against swap and recompute in the simulator on NEO's three GPUs (issue 27, item 5):
the T4, A10G and H100 profiles (datasheet bandwidths and FLOP/s, kvtier/costmodel/hardware.py),
each with a model that fits it and a capped GPU KV pool, on ShareGPT requests all sent at
time 0 (offline throughput: output tokens over the makespan). The paper reports +7.5x / +26 %
/ +14 % over GPU-only on T4 / A10G / H100 (its synthetic sweeps' peaks).

  python -m benchmarks.sim.sim_neo_profiles --workload .carry/sharegpt_llama31_1000.json \
      --out results/sim/neo_profiles_sim.json
  python -m benchmarks.sim.sim_neo_profiles ... --rows neo --cap-factors 0.5,1,2,4,8 --out ...

The second sweeps each setting's KV pool (times the factors): where NEO's gain over the
better of swap and recompute vanishes as the pool grows (issue 27 item 5, by the cost model).

NEO runs six times: with its CPU/GPU balance (--neo-cpu-balance, kvtier/policies/neo/balance.py),
without it (every overflowing decode moves to the host), balanced but with no GPU-only
steps (--neo-max-skipped-steps 0: every step runs its CPU decodes, sequentially or
pipelined, kvtier/policies/neo/modes.py), and with prompts admitted past the device pool
(--neo-host-admission, kvtier/policies/host_resident/admission.py), balanced and not.

The CPU attention is priced at one rate on every profile (kvtier/policies/neo/'s
CPU_ATTENTION_BYTES_PER_S, the H200 host's), not at NEO's hosts' (a g4dn's CPU reads far less
than that): the host side is the same machine in every row, only the GPU changes. The trace is
tokenized for Llama 3.1; for llama-2-7b its ids are folded into that vocabulary (the simulator
prices lengths, not ids).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from benchmarks.common import write_result
from kvtier.bench.prepared import load_prepared
from kvtier.bench.request import LengthLimits
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.model.presets import preset_config
from kvtier.policies.neo import CPU_ATTENTION_BYTES_PER_S, price_cpu_rows
from kvtier.sim import build_sim_engine, run_simulation

# (row name, --kv-policy, its flags): NEO with its CPU/GPU balance (the default), without it
# (every overflowing decode moves to the host, whatever the CPU attention then costs),
# without its GPU-only steps (the CPU decodes run in every step), and admitting prompts past
# the device pool (its CPU prefills).
POLICIES = (("recompute", "recompute", {}), ("swap", "swap", {}),
            ("neo", "neo", {}), ("neo_unbalanced", "neo", {"neo_cpu_balance": 0.0}),
            ("neo_no_gpu_only", "neo", {"neo_max_skipped_steps": 0}),
            ("neo_host_admission", "neo", {"neo_host_admission": True}),
            ("neo_unbalanced_host_admission", "neo",
             {"neo_cpu_balance": 0.0, "neo_host_admission": True}))


@dataclasses.dataclass(frozen=True)
class Setting:
    hardware: str
    model: str
    dtype: str
    kv_cache_gib: float  # the capped GPU KV pool


# T4: llama-2-7b in fp16 (12.6 GiB of weights on a 15 GiB card leaves ~1.5 GiB of KV beside
# the activations: 3,072 tokens at its 0.5 MiB a token). A10G: NEO's own cap, 1,650 vLLM
# blocks of 16 tokens of llama-3.1-8b (128 KiB a token: 3.2 GiB). H100: the same 8B model at
# the same cap (NEO ran its 70B there).
# Every row is bf16: NEO's CPU attention reads bf16 or fp32 KV (a T4 has no bf16 and would
# run fp16, the same bytes and the same tensor rate in its profile).
SETTINGS = (
    Setting("t4", "llama-2-7b", "bfloat16", 1.5),
    Setting("a10g", "llama-3.1-8b", "bfloat16", 1650 * 16 * 128 / (1 << 20)),
    Setting("h100-sxm", "llama-3.1-8b", "bfloat16", 1650 * 16 * 128 / (1 << 20)),
)
# Run only when --profiles names them: the H200 this project measures on, the same model and
# cap, its host rows priced by the profile's fit of the measured runs (fit_host_rows.py).
EXTRA_SETTINGS = (Setting("h200", "llama-3.1-8b", "bfloat16", 1650 * 16 * 128 / (1 << 20)),)


def requests(path: str, n: int, vocab: int) -> list[tuple[tuple[int, ...], int, float]]:
    reqs = load_prepared(path, n, LengthLimits())
    return [(tuple(t % vocab for t in r.prompt_token_ids), r.output_len, 0.0) for r in reqs]


def run(setting: Setting, name: str, policy: str, flags: dict, reqs, args) -> dict:
    if policy == "neo" and "neo_cpu_balance" not in flags:
        flags = {**flags, "neo_cpu_balance": args.neo_cpu_balance}
    engine_args = EngineArgs(model=setting.model, load_format="dummy", dtype=setting.dtype,
                             kv_policy=policy, kv_cache_gb=setting.kv_cache_gib,
                             max_model_len=args.max_model_len, swap_space=args.swap_gib,
                             max_num_seqs=args.max_num_seqs, **flags)
    engine = build_sim_engine(engine_args, setting.hardware, record_steps=policy == "neo")
    times = run_simulation(engine, reqs)
    done = [t for t in times if t.finish_s is not None]
    makespan = max(t.finish_s for t in done)
    out_tokens = sum(t.output_len for t in done)
    row = {"policy": name, "flags": flags, "output_tok_s": out_tokens / makespan, "makespan_s": makespan,
           "finished": len(done), "preemptions": engine.get_stats().num_preemptions_total}
    placement = engine.scheduler.policy
    if policy == "neo":  # its moves, those its balance refused, how its steps ran
        row |= {"moved_to_host": placement.num_moved_out,
                "moved_to_host_for_prompts": placement.num_moved_for_prompts,
                "moves_refused_by_balance": placement.num_refused_by_system,
                "pipelined_steps": placement.num_pipelined_steps,
                "gpu_only_steps": placement.num_gpu_only_steps,
                "partly_held_steps": placement.num_partly_held_steps, **host_steps(engine)}
    return row


def host_steps(engine) -> dict:
    """Steps with CPU rows: how many, how many priced their CPU attention above their GPU
    forward (the balance holds when a request moves, not as its context grows), and the
    seconds of each side over them (a pipelined step's GPU side: both sub-batches)."""
    gpu_parts = ("forward", "layers", "head", "attn_tail")  # the forward's parts by path
    cm = engine.executor.cost_model
    cpu, gpu = [], []
    for s in engine.executor.steps:
        rows = sum(n for k, n in s.shape.items if k == "neo_cpu_rows")
        if rows:
            cpu.append(price_cpu_rows(cm, rows))
            gpu.append(sum(s.cost.parts.get(k, 0.0) for k in gpu_parts))
    return {"cpu_row_steps": len(cpu),
            "cpu_row_steps_cpu_over_gpu": sum(c > g for c, g in zip(cpu, gpu, strict=True)),
            "cpu_row_steps_cpu_attention_s": sum(cpu), "cpu_row_steps_gpu_forward_s": sum(gpu)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", required=True)
    ap.add_argument("--num-prompts", type=int, default=300)
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--swap-gib", type=float, default=32.0)
    ap.add_argument("--neo-cpu-balance", type=float, default=1.0,
                    help="the balanced neo row's --neo-cpu-balance")
    ap.add_argument("--profiles", default=",".join(s.hardware for s in SETTINGS),
                    help="which settings run, by hardware profile (NEO's three by default; "
                         "also: " + ",".join(s.hardware for s in EXTRA_SETTINGS) + ")")
    ap.add_argument("--rows", default=",".join(p[0] for p in POLICIES),
                    help="which rows run, by name (swap and recompute always do)")
    ap.add_argument("--cap-factors", default="1",
                    help="each setting's KV pool times these (a sweep: where NEO's gain "
                         "vanishes as the pool grows)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    wanted = {"swap", "recompute", *args.rows.split(",")}
    policies = [p for p in POLICIES if p[0] in wanted]
    settings = [dataclasses.replace(s, kv_cache_gib=s.kv_cache_gib * float(f))
                for s in SETTINGS + EXTRA_SETTINGS if s.hardware in args.profiles.split(",")
                for f in args.cap_factors.split(",")]
    profiles = []
    for s in settings:
        t0 = time.perf_counter()
        reqs = requests(args.workload, args.num_prompts, preset_config(s.model)["vocab_size"])
        try:
            rows = [run(s, *p, reqs, args) for p in policies]
        except ConfigError as e:  # a pool swept below one request of max_model_len
            profiles.append({**dataclasses.asdict(s), "skipped": str(e)})
            print(s.hardware, f"{s.kv_cache_gib:.2f} GiB skipped: {e}", flush=True)
            continue
        rate = {r["policy"]: r["output_tok_s"] for r in rows}
        best_other = max(rate["swap"], rate["recompute"])
        gains = {f"{name}_gain_over_best_of_swap_recompute": rate[name] / best_other - 1
                 for name, policy, _ in policies if policy == "neo"}
        profiles.append({**dataclasses.asdict(s), "rows": rows, **gains})
        print(s.hardware, f"{s.kv_cache_gib:.2f} GiB", rate, f"{time.perf_counter() - t0:.1f}s",
              flush=True)
    write_result(args.out, {"benchmark": "sim_neo_profiles", "workload": args.workload,
                            "num_prompts": args.num_prompts, "arrivals": "all at time 0",
                            "max_num_seqs": args.max_num_seqs, "swap_gib": args.swap_gib,
                            "cap_factors": args.cap_factors,
                            "cpu_attention_bytes_per_s": CPU_ATTENTION_BYTES_PER_S,
                            "paper_gain_over_gpu_only": {"t4": 6.5, "a10g": 0.26,
                                                         "h100-sxm": 0.14},
                            "profiles": profiles})


if __name__ == "__main__":
    main()
