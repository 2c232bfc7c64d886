"""Host (CPU) time the prefix cache adds: per request (hashing its blocks, the lookup on
admission, registering its blocks, its release) and per decode step at 256 running requests.
Targets (issue 25): < 0.1 ms per request, < 0.2 ms per step at 256 requests.

Per request: the cache's own calls (`on_admit`, `cache_full_blocks`, `on_finish`) are timed
one by one on a KV manager shaped like llama-3.1-8b's (block 16, 8 layer groups), for a
prompt that misses (every block hashed and registered) and one that hits every block but
the last, at several prompt lengths and both hash functions.

Per step: the real `Scheduler.schedule()` + `update()` of decode steps at 256 running
requests (prompts of 512 distinct tokens, so nothing hits and every block is registered),
with the cache against without, steps interleaved; the difference of the medians is the
cache's cost per step. No model runs: sampled tokens are constants.

  python -m benchmarks.engine.bench_prefix_cache_host \
      --out results/engine/prefix_cache_host_cpu.json
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from benchmarks.common import write_result
from kvtier.config import SchedulerConfig
from kvtier.core.plan import StepResult
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheConfig
from kvtier.policies import get_policy
from kvtier.sampling_params import SamplingParams
from kvtier.scheduler.scheduler import Scheduler

BLOCK, GROUPS = 16, 8


def _manager(algo: str | None, num_token_blocks: int) -> KVCacheManager:
    return KVCacheManager(num_groups=GROUPS, block_size=BLOCK,
                          num_gpu_blocks=num_token_blocks * GROUPS, num_host_blocks=0,
                          watermark=0.0,
                          prefix_cache=PrefixCacheConfig(algo) if algo else None)  # type: ignore[arg-type]


def _request(rid: str, tokens: list[int], max_tokens: int = 16) -> Request:
    return Request(rid, tokens, SamplingParams(max_tokens=max_tokens), max_tokens=max_tokens)


def _one_life(kv: KVCacheManager, r: Request) -> tuple[int, int, int]:
    """ns in on_admit, cache_full_blocks, on_finish for one request's whole prefill."""
    cache = kv.prefix_cache
    assert cache is not None
    t0 = time.perf_counter_ns()
    hit = cache.on_admit(r, kv)
    t1 = time.perf_counter_ns()
    r.num_computed_tokens = hit
    assert kv.allocate_slots(r, r.num_tokens - hit) is not None
    r.num_computed_tokens = r.num_tokens
    t2 = time.perf_counter_ns()
    cache.cache_full_blocks(r, r.num_tokens, kv)
    t3 = time.perf_counter_ns()
    r.status = RequestStatus.FINISHED_STOPPED
    kv.hooks.remove(cache)  # time the cache's on_finish alone, not the table's release
    t4 = time.perf_counter_ns()
    cache.on_finish(r, kv)
    t5 = time.perf_counter_ns()
    kv.free(r)
    kv.hooks.append(cache)
    return t1 - t0, t3 - t2, t5 - t4


def per_request(algo: str, prompt_len: int, reps: int) -> dict[str, float]:
    rng = random.Random(0)
    # Room for every request's blocks: no eviction inside the timed calls.
    kv = _manager(algo, num_token_blocks=(reps + 2) * (prompt_len // BLOCK + 1))
    shared = [rng.randrange(1, 128_000) for _ in range(prompt_len)]
    _one_life(kv, _request("warm", list(shared)))
    out: dict[str, float] = {}
    for case in ("miss", "hit"):
        lives = []
        for i in range(reps):
            tokens = list(shared) if case == "hit" else [rng.randrange(1, 128_000)
                                                         for _ in range(prompt_len)]
            lives.append(_one_life(kv, _request(f"{case}{i}", tokens)))
        for name, k in (("admit", 0), ("register", 1), ("finish", 2)):
            out[f"{case}_{name}_us"] = statistics.median(x[k] for x in lives) / 1e3
        out[f"{case}_total_us"] = statistics.median(sum(x) for x in lives) / 1e3
    return out


def _decode_scheduler(algo: str | None, num_requests: int, prompt_len: int) -> Scheduler:
    rng = random.Random(1)
    blocks = num_requests * ((prompt_len + 600) // BLOCK + 1)
    kv = _manager(algo, num_token_blocks=blocks)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=num_requests,
                                      max_model_len=prompt_len + 1024), kv, get_policy("recompute"))
    for i in range(num_requests):
        sched.add_request(_request(str(i), [rng.randrange(1, 128_000) for _ in range(prompt_len)],
                                   max_tokens=1_000))
    while sched.waiting or any(r.num_computed_tokens < r.num_prompt_tokens
                               for r in sched.running):
        _step(sched)  # prefills
    assert len(sched.running) == num_requests
    return sched


def _step(sched: Scheduler) -> int:
    t0 = time.perf_counter_ns()
    plan = sched.schedule()
    sched.update(plan, StepResult({sr.request_id: 7 for sr in plan.scheduled if sr.sample}))
    return time.perf_counter_ns() - t0


def per_step(algo: str, num_requests: int, prompt_len: int, steps: int) -> dict[str, float]:
    on = _decode_scheduler(algo, num_requests, prompt_len)
    off = _decode_scheduler(None, num_requests, prompt_len)
    gc.collect()
    gc.freeze()  # as the engine does after start-up (kvtier/engine/assembly.py)
    times: dict[str, list[int]] = {"on": [], "off": []}
    for _ in range(steps):  # interleaved: drifts of a shared machine hit both alike
        times["on"].append(_step(on))
        times["off"].append(_step(off))
    on.check_integrity()
    gc.unfreeze()
    med = {k: statistics.median(v) / 1e3 for k, v in times.items()}
    mean = {k: statistics.fmean(v) / 1e3 for k, v in times.items()}
    cache = on.kv.prefix_cache
    assert cache is not None
    # Median: a typical step; mean: with the steps where many requests fill a block at once.
    return {"step_on_median_us": med["on"], "step_off_median_us": med["off"],
            "cache_cost_per_step_median_us": med["on"] - med["off"],
            "step_on_mean_us": mean["on"], "step_off_mean_us": mean["off"],
            "cache_cost_per_step_mean_us": mean["on"] - mean["off"],
            "cached_blocks": cache.num_cached_blocks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="results/engine/prefix_cache_host_cpu.json")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 4096])
    args = ap.parse_args()
    requests = {f"{algo}/{n}": per_request(algo, n, args.reps)
                for algo in ("sha256", "builtin") for n in args.prompt_lens}
    steps = {algo: per_step(algo, 256, 512, args.steps) for algo in ("sha256", "builtin")}
    for k, v in {**requests, **steps}.items():
        print(k, {n: round(x, 1) for n, x in v.items()})
    write_result(args.out, {"block_size": BLOCK, "num_groups": GROUPS,
                            "per_request": requests, "per_step_256_requests": steps,
                            "targets_us": {"per_request": 100, "per_step": 200}})


if __name__ == "__main__":
    main()
