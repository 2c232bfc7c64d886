"""On the CPU the KV pools are sized from the model and the scheduler's limits, so a first
run is small: max_num_seqs requests of max_model_len never need more."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from kvtier.entrypoints.llm import LLM
from kvtier.sampling_params import SamplingParams

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_pools_hold_the_seats_and_no_more():
    llm = LLM("tiny-llama", load_format="dummy", device="cpu", kv_policy="swap",
              max_num_seqs=4, max_model_len=256)
    runner = llm.engine.executor
    cache, sched = llm.engine.config.cache, llm.engine.config.scheduler
    groups = cache.num_layer_groups(llm.engine.config.model_config.num_layers)
    seats_blocks = sched.max_num_seqs * groups * (sched.max_model_len // cache.block_size)
    block_bytes = runner.gpu_kv[0].nbytes
    assert runner.gpu_kv.shape[0] <= seats_blocks + 1  # one scratch block at most
    assert runner.host_kv.shape[0] <= seats_blocks
    assert (runner.gpu_kv.nbytes + runner.host_kv.nbytes) <= 2 * (seats_blocks + 1) * block_bytes
    out = llm.generate(["The KV cache"] * 4, SamplingParams(temperature=0.0, max_tokens=200))
    assert all(len(o.outputs[0].token_ids) == 200 for o in out)  # every seat runs to length


HELLO = """
from kvtier import LLM, SamplingParams
llm = LLM("tiny-llama", load_format="dummy", kv_policy="swap")
out = llm.generate(["The KV cache"], SamplingParams(temperature=0.0, max_tokens=32))
assert len(out[0].outputs[0].token_ids) == 32
# VmHWM, not getrusage's ru_maxrss: that one keeps the forking parent's peak across exec
# (a pytest process gigabytes in would count as the hello-world's own).
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


def test_hello_world_stays_small():
    """The README's example with every default: its resident memory is the interpreter,
    torch and a small pool, not gigabytes of zeroed KV."""
    done = subprocess.run([sys.executable, "-c", HELLO], check=True, cwd=ROOT, timeout=300,
                          capture_output=True, text=True)
    peak_kib = int(done.stdout.split()[-1])
    assert peak_kib < 1_000_000, f"hello world peaked at {peak_kib / 1e6:.2f} GB resident"
