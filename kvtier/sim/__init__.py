"""The simulator: kvtier's own scheduler and KV manager driven by a cost model on a virtual
clock, so hours of trace replay in seconds on a CPU.

    from kvtier.engine.args import EngineArgs
    from kvtier.sim import build_sim_engine, run_simulation

    engine = build_sim_engine(
        EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=4096),
        hardware="h200",                     # or "a100-80gb" (datasheet roofline)
        calibration="results/calibration/calib_h200_llama-2-13b.json",  # or None
        num_gpus=1)                          # tensor parallel degree
    times = run_simulation(engine, [(prompt_ids, output_len, arrival_s), ...])
    times[0].ttft_s, times[0].tpot_s, times[0].token_times_s

`build_sim_engine` returns a real `LLMEngine` (same API as `LLMEngine.from_engine_args`):
its scheduler, KV manager and policies are the real ones, pool sizes come from the
simulated GPU's memory by the real formula (or `num_gpu_blocks` / `kv_cache_gb`), and
`engine.clock` is a `VirtualClock`. Every `engine.step()` advances that clock by the cost
model's prediction of the step's plan.

With the bench harness (`kvtier/bench/`), the virtual clock is also the runner's clock:

    clock = engine.clock                          # has now() and sleep(): a bench Clock
    backend = EngineBackend(engine, ignore_eos=True, clock=clock)
    result = run_workload(backend, workload.requests, RunOptions(progress=False), clock=clock)
    summarize_run(result, slo)                    # the same metrics as a real run

(`run_workload` "sleeps" on the virtual clock between arrivals, which jumps instead.) For
`kvtier/bench/experiment.py`, share one clock between the engines and the runner:

    clock = VirtualClock()
    factory = lambda policy: build_sim_engine(replace(args, kv_policy=policy), "h200",
                                              calib, num_gpus, clock=clock)
    backends = engine_backends(factory, ignore_eos, clock)   # EngineBackend(..., clock)

and `run_once`/`warm_up` must hand that clock to `run_workload` too (they use the monotonic
clock today, which would make the runner sleep in real time between virtual arrivals).

`SimulatedExecutor(cost_model, clock, token_id, eos_token_id, output_lens)` is the executor
alone; `output_lens` (request id -> tokens) ends requests with eos at those lengths for
workloads that do not ignore eos.
"""

from kvtier.sim.clock import VirtualClock
from kvtier.sim.driver import RequestTimes, run_simulation
from kvtier.sim.engine import build_sim_engine
from kvtier.sim.executor import SimStep, SimulatedExecutor

__all__ = ["RequestTimes", "SimStep", "SimulatedExecutor", "VirtualClock", "build_sim_engine",
           "run_simulation"]
