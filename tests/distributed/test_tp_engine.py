"""Two processes on the CPU (gloo, fp32): the tensor-parallel engine's greedy outputs equal
one process's, for every memory system under forced preemption; KV heads are replicated
when the ranks outnumber them; a worker that dies is reported, not waited on."""

from __future__ import annotations

import json
import os
import random
import signal
import time

import pytest
import torch

from kvtier import SamplingParams
from kvtier.distributed.messages import TPWorkerError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.model.presets import PRESETS

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(autouse=True)
def one_thread():
    """One intra-op thread here too (each rank takes its share of the cores, see
    TPRunnerFactory): the one-process reference is not slowed by spinning threads."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)


def _engine(tp: int, **kw) -> LLMEngine:
    # The async-scheduling tests' pool: 10 device blocks for 8 requests, so every policy
    # preempts (recompute, swap-out, dropped prefixes, hidden states).
    opts = dict(model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
                max_model_len=80, num_gpu_blocks=10, num_host_blocks=40, max_num_seqs=6,
                max_num_batched_tokens=64, tensor_parallel_size=tp)
    opts.update(kw)
    return LLMEngine.from_engine_args(EngineArgs(**opts))


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, 900) for _ in range(rng.randrange(3, 40))] for _ in range(n)]


def _serve(eng: LLMEngine, prompts, params=GREEDY) -> tuple[dict, int]:
    """Every request's tokens (and logprobs), checking the KV manager after every step."""
    try:
        for i, p in enumerate(prompts):
            eng.add_request(str(i), p, params[i % len(params)] if isinstance(params, list)
                            else params)
        finals = {}
        while eng.has_unfinished_requests():
            for out in eng.step():
                if out.finished:
                    c = out.outputs[0]
                    finals[out.request_id] = (c.token_ids, c.logprobs)
            eng.check_integrity()
        return finals, eng.scheduler.counters.num_preemptions
    finally:
        eng.close()


@pytest.mark.parametrize("policy, extra", [
    ("recompute", {}), ("swap", {}), ("ellm", {}), ("hcache", {}),
    ("recompute", {"async_scheduling": True}),
])
def test_tp2_greedy_equals_one_process(policy, extra):
    prompts = _prompts(8)
    one, _ = _serve(_engine(1, kv_policy=policy, **extra), prompts)
    two, preemptions = _serve(_engine(2, kv_policy=policy, **extra), prompts)
    assert two == one
    assert preemptions > 0  # the pool was too small: the policy moved KV per shard


def test_tp2_rank0_samples_and_broadcasts():
    """Seeded random sampling, logprobs and penalties (not plain greedy: rank 0 samples,
    the tokens reach the other rank by broadcast) give one process's tokens."""
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12,
                             ignore_eos=True, logprobs=2), GREEDY,
              SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True,
                             frequency_penalty=1.5, logit_bias={7: 3.0}),
              SamplingParams(temperature=0.7, seed=3, max_tokens=12,
                             structured_outputs={"regex": "[a-f]{3,8}"})]
    prompts = _prompts(4, seed=1)
    one, _ = _serve(_engine(1, num_gpu_blocks=40), prompts, params)
    two, _ = _serve(_engine(2, num_gpu_blocks=40), prompts, params)
    assert {k: v[0] for k, v in two.items()} == {k: v[0] for k, v in one.items()}
    lp_one, lp_two = one["0"][1], two["0"][1]
    assert lp_two is not None and [d.keys() for d in lp_two] == [d.keys() for d in lp_one]


def test_kv_heads_replicated_when_tp_exceeds_them(tmp_path):
    model = tmp_path / "one-kv-head"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({**PRESETS["tiny-llama"],
                                                   "num_key_value_heads": 1}))
    kw = dict(model=str(model), num_gpu_blocks=40)
    one, _ = _serve(_engine(1, **kw), _prompts(4))
    eng = _engine(2, **kw)
    runner = eng.executor.runner  # rank 0's
    assert runner.gpu_kv.shape[-2] == 1 and runner.model_config.num_heads == 2
    two, _ = _serve(eng, _prompts(4))
    assert two == one


def test_worker_death_is_an_error_not_a_hang():
    eng = _engine(2, num_gpu_blocks=40)
    try:
        eng.add_request("a", [5, 6, 7], GREEDY)
        eng.step()
        worker = eng.executor.workers.procs[0]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        start = time.monotonic()
        with pytest.raises(TPWorkerError, match=r"rank 1 died \(exit code -9\)"):
            for _ in range(5):
                eng.step()
        assert time.monotonic() - start < 30
    finally:
        eng.close()
    assert not any(p.is_alive() for p in eng.executor.workers.procs)


def test_a_script_without_a_main_guard_gets_a_clear_error(tmp_path):
    """Spawned workers import the main script again; one that starts the engine at import
    time makes them fail before they start: the driver says so (and hangs nowhere)."""
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "no_guard.py"
    script.write_text("from kvtier.engine.args import EngineArgs\n"
                      "from kvtier.engine.llm_engine import LLMEngine\n"
                      "LLMEngine.from_engine_args(EngineArgs(model='tiny-llama', "
                      "load_format='dummy', device='cpu', num_gpu_blocks=40, "
                      "max_model_len=80, tensor_parallel_size=2))\n")
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=100, env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode != 0
    assert "exited before it started" in run.stderr and "__main__" in run.stderr


def test_tp_flag_on_the_command_line():
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    for argv in (["m", "-tp", "4"], ["m", "--tensor-parallel-size", "4"]):
        assert EngineArgs.from_cli_args(parser.parse_args(argv)).tensor_parallel_size == 4
    assert EngineArgs.from_cli_args(parser.parse_args(["m"])).tensor_parallel_size == 1
