import math

import pytest

from kvtier.config import ConfigError
from kvtier.costmodel.hardware import GiB, get_hardware
from kvtier.engine.args import EngineArgs
from kvtier.sampling_params import SamplingParams
from kvtier.sim import VirtualClock, build_sim_engine, run_simulation
from kvtier.sim.factory import activation_peak_bytes, weight_bytes

GREEDY = dict(temperature=0.0, ignore_eos=True, detokenize=False)


def args13(**kw) -> EngineArgs:
    return EngineArgs(model="llama-2-13b", load_format="dummy", max_model_len=4096, **kw)


def test_pool_size_follows_the_real_formula_on_the_simulated_gpu():
    e = build_sim_engine(args13(), "h200")
    cfg = e.config
    block = cfg.cache.block_bytes(cfg.model_config, 2)
    budget = get_hardware("h200").memory_bytes * 0.9
    expect = int((budget - weight_bytes(cfg) - activation_peak_bytes(cfg)) // block)
    assert e.scheduler.kv.gpu.num_blocks == expect
    assert e.block_bytes == block == 2 * 4 * 16 * 5120 * 2
    assert e.scheduler.kv.host.num_blocks == int(4 * GiB // block)


def test_overrides_and_memory_of_smaller_and_more_gpus():
    assert build_sim_engine(args13(num_gpu_blocks=5000), "h200").scheduler.kv.gpu.num_blocks == 5000
    e = build_sim_engine(args13(kv_cache_gb=10.0), "h200")
    assert e.scheduler.kv.gpu.num_blocks == int(10 * GiB // e.block_bytes)
    one = build_sim_engine(args13(), "a100-80gb").scheduler.kv.gpu.num_blocks
    two = build_sim_engine(args13(), "a100-80gb", num_gpus=2).scheduler.kv.gpu.num_blocks
    assert two > 2 * one  # each GPU also holds half the weights
    with pytest.raises(ConfigError):  # 70B's weights do not fit one A100
        build_sim_engine(EngineArgs(model="llama-2-70b", load_format="dummy",
                                    max_model_len=4096), "a100-80gb")


def test_clock_moves_by_the_predicted_step_times_only():
    e = build_sim_engine(args13(), "h200", record_steps=True)
    assert isinstance(e.clock, VirtualClock) and e.clock() == 0.0
    for i in range(5):
        e.add_request(str(i), list(range(100, 100 + 50 * (i + 1))), SamplingParams(max_tokens=20, **GREEDY))
    while e.has_unfinished_requests():
        e.step()
    steps = e.executor.steps
    assert math.isclose(e.clock(), sum(s.cost.total_s for s in steps), rel_tol=1e-12)
    assert steps[0].shape.kind == "prefill" and steps[-1].shape.kind == "decode"
    assert all(s.cost.total_s > 0 for s in steps)


def test_output_lens_end_requests_with_eos_where_the_workload_says():
    e = build_sim_engine(args13(), "h200", output_lens={"a": 7, "b": 1})
    for rid in ("a", "b", "c"):
        e.add_request(rid, [5, 6, 7, 8], SamplingParams(max_tokens=30, temperature=0.0, detokenize=False))
    done = {}
    while e.has_unfinished_requests():
        for out in e.step():
            if out.finished:
                done[out.request_id] = out.outputs[0]
    assert {k: len(v.token_ids) for k, v in done.items()} == {"a": 7, "b": 1, "c": 30}
    assert done["a"].finish_reason == "stop" and done["c"].finish_reason == "length"


def test_run_simulation_jumps_over_idle_time_and_stamps_latencies():
    e = build_sim_engine(args13(), "h200", record_steps=True)
    reqs = [([1] * 200, 50, 0.0), ([2] * 100, 10, 0.001), ([3] * 30, 5, 100.0)]
    times = run_simulation(e, reqs)
    assert [t.output_len for t in times] == [50, 10, 5]
    late = times[2]
    assert late.arrival_s == 100.0 and late.first_token_s > 100.0
    assert late.ttft_s < 0.2 and all(t.ttft_s > 0 and t.tpot_s > 0 for t in times[:2])
    assert all(b > a for t in times for a, b in zip(t.token_times_s, t.token_times_s[1:]))
    # Between t ~ 1 s and 100 s nothing runs: no steps were simulated there.
    assert not [s for s in e.executor.steps if 5.0 < s.start_s < 100.0]


def test_a_faster_gpu_finishes_sooner():
    reqs = [([7] * 300, 100, 0.01 * i) for i in range(40)]
    h = run_simulation(build_sim_engine(args13(), "h200"), reqs)
    a = run_simulation(build_sim_engine(args13(), "a100-80gb"), reqs)
    assert max(t.finish_s for t in h) < max(t.finish_s for t in a)


def test_ellm_lends_scratch_blocks_from_the_pool_as_the_real_builder_does():
    from kvtier.policies.ellm import recompute_scratch_blocks

    base = build_sim_engine(args13(), "h200")
    ellm = build_sim_engine(args13(kv_policy="ellm"), "h200")
    scratch = recompute_scratch_blocks(ellm.config)
    assert scratch > 0
    assert ellm.scheduler.kv.gpu.num_blocks == base.scheduler.kv.gpu.num_blocks - scratch


def test_swap_overlap_flag_reaches_the_cost_model():
    on = build_sim_engine(args13(kv_policy="swap"), "h200").executor.cost_model.config
    off = build_sim_engine(args13(kv_policy="swap", overlap_swap=False),
                           "h200").executor.cost_model.config
    assert on.overlap_swap and not off.overlap_swap
    assert on.layers_per_block == 4
