"""A memory system added without editing kvtier: tests/policies/host_keep/ (a preempted
request's KV kept in the host pool through plan items of its own) registered from here, run
end to end through LLM, the CLI option parser, the simulator and the cost model."""

from __future__ import annotations

import random

import pytest

from kvtier.costmodel.hardware import get_hardware
from kvtier.costmodel.model import CostModel, CostModelConfig
from kvtier.costmodel.shape import StepShape
from kvtier.engine.args import EngineArgs
from kvtier.entrypoints.llm import LLM
from kvtier.model.loader import resolve_model_config
from kvtier.policies import policy_names, unregister_system
from kvtier.sampling_params import SamplingParams
from kvtier.sim.engine import build_sim_engine
from tests.policies import host_keep
from tests.policies.host_keep.items import RUNS, KeepIn


@pytest.fixture(autouse=True)
def registered():
    host_keep.register()
    yield
    unregister_system("host_keep")


# tiny-llama with a pool of ~5 requests' worth of blocks: the scheduler preempts often.
SMALL = dict(model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
             num_gpu_blocks=16, num_host_blocks=64, max_model_len=256,
             max_num_batched_tokens=96, max_num_seqs=8)


def prompts(n: int = 10) -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 4000) for _ in range(rng.randint(20, 70))] for _ in range(n)]


def test_it_is_registered_with_its_own_flag():
    assert "host_keep" in policy_names()
    from kvtier.cli import build_parser

    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", "host_keep",
                                    "--host-keep-max-kept", "3"])
    args = EngineArgs.from_cli_args(ns)
    assert args.host_keep_max_kept == 3
    assert args.create_engine_config().policy_options.max_kept == 3


def test_its_greedy_outputs_equal_recompute_and_its_hooks_ran():
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    ps = [{"prompt_token_ids": p} for p in prompts()]
    RUNS.update(out=0, **{"in": 0})
    keep = LLM(kv_policy="host_keep", **SMALL)
    kept = [o.outputs[0].token_ids for o in keep.generate(ps, params)]
    stats = keep.engine.get_stats()
    assert stats.num_preemptions_total > 0 and keep.engine.scheduler.kv.all_free()
    assert RUNS["out"] > 0 and RUNS["in"] == RUNS["out"]  # every kept block came back
    assert stats.num_swap_out_blocks_total == 0  # its own items, not the runner's swaps
    recompute = LLM(kv_policy="recompute", **SMALL)
    assert kept == [o.outputs[0].token_ids for o in recompute.generate(ps, params)]


def test_the_simulator_runs_it_and_prices_its_items():
    args = EngineArgs(kv_policy="host_keep", **{**SMALL, "device": "auto", "dtype": "auto"})
    engine = build_sim_engine(args, "h200", record_steps=True)
    params = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, params)
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_integrity()
    steps = [s for s in engine.executor.steps if s.shape.items]
    kinds = {k for s in steps for k, _ in s.shape.items}
    assert kinds == {"host_keep_out", "host_keep_in"}
    assert all(s.cost.parts["items"] > 0 for s in steps)


def test_the_cost_model_prices_its_items_at_its_own_price():
    mc, _ = resolve_model_config("llama-2-13b", "dummy")
    cm = CostModel(mc, get_hardware("h200"), None, CostModelConfig(block_bytes=1 << 20))
    plain = cm.predict(StepShape(num_decodes=8, decode_ctx_sum=8000, decode_ctx_max=1000,
                                 num_sampled=8))
    with_items = cm.predict(StepShape(num_decodes=8, decode_ctx_sum=8000, decode_ctx_max=1000,
                                      num_sampled=8, items=((KeepIn.kind, 10),)))
    _, inn = cm.copy_costs()
    assert with_items.parts["items"] == pytest.approx(inn.seconds(10 << 20))
    assert with_items.executor_s == pytest.approx(plain.executor_s + inn.seconds(10 << 20))
