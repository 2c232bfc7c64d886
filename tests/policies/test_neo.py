"""NEO's flags, its refusal of a config it cannot serve, and its CPU attention running off
the Python main thread during an engine's steps (on the kernel's own thread; on a Python
worker thread where the kernel is not built)."""

from __future__ import annotations

import threading

import pytest

import kvtier.kernels.cpu_attention as cpu_attention
import kvtier.kernels.cpu_attention_layers as cpu_attention_layers
from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.kernels.cpu_attention_build import cpu_attention_extension
from kvtier.kernels.cpu_attention_layers import StepLayers
from kvtier.policies.neo import NeoOptions
from tests.policies.test_host_resident_engine import run


def test_its_flags_parse_into_its_options():
    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", "neo",
                                    "--neo-swap-in-fraction", "0.9", "--neo-cpu-threads", "3"])
    args = EngineArgs.from_cli_args(ns)
    options = args.create_engine_config().policy_options
    assert isinstance(options, NeoOptions)
    assert (options.swap_in_fraction, options.cpu_threads) == (0.9, 3)


def test_bad_values_and_unused_flags_are_refused():
    with pytest.raises(ConfigError, match="swap_in_fraction"):
        EngineArgs(model="tiny-llama", kv_policy="neo", neo_swap_in_fraction=1.5
                   ).create_engine_config()
    with pytest.raises(ConfigError, match="cpu_threads"):
        EngineArgs(model="tiny-llama", kv_policy="neo", neo_cpu_threads=0).create_engine_config()
    with pytest.raises(ConfigError, match="--neo-cpu-threads"):
        EngineArgs(model="tiny-llama", kv_policy="swap", neo_cpu_threads=2).create_engine_config()
    with pytest.raises(ConfigError, match="needs --neo-graphs"):
        EngineArgs(model="tiny-llama", kv_policy="neo", neo_graphs=False,
                   neo_flagged_pipeline=True).create_engine_config()


def test_fp16_kv_is_refused():
    from kvtier.engine.assembly import check_config

    config = EngineArgs(model="tiny-llama", load_format="dummy", kv_policy="neo",
                        dtype="float16").create_engine_config()
    with pytest.raises(ConfigError, match="bf16 or fp32"):
        check_config(config)


def recorded_workers(monkeypatch) -> list:
    """The CpuLayerWorker of every layer call an engine makes."""
    workers: list = []
    real = StepLayers.submit

    def recording(self, *args, **kwargs):
        workers.append(self.worker)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(StepLayers, "submit", recording)
    return workers


def test_the_cpu_attention_runs_on_the_kernels_own_thread(monkeypatch):
    if cpu_attention_extension() is None:
        pytest.skip("the C++ kernel could not be built here")
    workers = recorded_workers(monkeypatch)
    _, engine, host_steps = run("neo")
    assert host_steps > 0 and workers
    native = workers[0].native
    assert native.jobs_run() == len(workers)  # every layer call ran there
    assert native.native_id() not in (threading.get_native_id(), -1)


def test_without_the_kernel_it_runs_on_a_python_worker_thread(monkeypatch):
    """The fallback (no compiler): the torch reference on a Python thread, not the main one,
    with the outputs of GPU-only."""
    gpu_only, _, _ = run("recompute", num_gpu_blocks=256)
    # Both lookups: the layer calls' (no native thread) and the wrapper's (no C++ call).
    monkeypatch.setattr(cpu_attention_layers, "cpu_attention_extension", lambda: None)
    monkeypatch.setattr(cpu_attention, "cpu_attention_extension", lambda: None)
    threads: set[str] = set()
    real = cpu_attention.cpu_decode_attention_reference

    def recording(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention, "cpu_decode_attention_reference", recording)
    outputs, _, host_steps = run("neo")
    assert host_steps > 0 and threads
    assert all(name.startswith("cpu-attention") for name in threads)
    assert outputs == gpu_only


def test_pipelined_steps_give_the_sequential_outputs():
    gpu_only, _, _ = run("recompute", num_gpu_blocks=256)
    outputs, engine, host_steps = run("neo", neo_pipeline="on")
    assert host_steps > 5 and engine.scheduler.policy.num_pipelined_steps > 0
    assert outputs == gpu_only
    _, engine, _ = run("neo", neo_pipeline="off")
    assert engine.scheduler.policy.num_pipelined_steps == 0


def test_a_pipelined_step_that_fails_waits_for_the_cpu_layer_in_flight(monkeypatch):
    """Batch 0's layer raises while batch 1's attention runs on the CPU: the step's error
    reaches the caller only once that layer has run (it reads the step's buffers and writes
    its rows' host pages)."""
    if cpu_attention_extension() is None:
        pytest.skip("the C++ kernel could not be built here")
    import kvtier.policies.neo.pipelined as pipelined
    from kvtier.model.llama import DecoderLayer
    from tests.policies.test_host_resident_engine import CAPPED, LIFTED, PARAMS, prompts

    steps: list = []
    real_per_layer, real_forward = pipelined.per_layer, DecoderLayer.forward

    def recording(rows):
        steps.append(rows)
        return real_per_layer(rows)

    def failing(self, *args, **kwargs):
        if steps:  # the pipelined step's batch 0, its layer 0 (batch 1's is on the CPU)
            raise RuntimeError("batch 0 failed")
        return real_forward(self, *args, **kwargs)

    monkeypatch.setattr(pipelined, "per_layer", recording)
    monkeypatch.setattr(DecoderLayer, "forward", failing)
    engine = LLMEngine.from_engine_args(EngineArgs(
        kv_policy="neo", neo_pipeline="on", **{**CAPPED, **LIFTED["neo"]}))
    for i, p in enumerate(prompts()):
        engine.add_request(f"r{i}", p, PARAMS)
    with pytest.raises(RuntimeError, match="batch 0 failed"):
        while engine.has_unfinished_requests():
            engine.step()
    pending = steps[0].calls._pending
    assert pending is not None and pending.done()


def test_neos_rule_pipelines_only_when_the_gpu_work_hides_the_cpu_attention():
    from kvtier.core.plan import ScheduledRequest
    from kvtier.costmodel.hardware import get_hardware
    from kvtier.costmodel.model import CostModel, CostModelConfig
    from kvtier.model.loader import resolve_model_config
    from kvtier.policies.neo import price_cpu_rows
    from kvtier.policies.neo.pipeline import PipelineRule
    from kvtier.sampling_params import SamplingParams

    mc, _ = resolve_model_config("llama-3.1-8b", "dummy")
    rule = PipelineRule(CostModel(mc, get_hardware("h200"), None,
                                  CostModelConfig(block_bytes=1 << 20)), price_cpu_rows)
    p = SamplingParams()

    def decode(i: int, ctx: int) -> ScheduledRequest:
        return ScheduledRequest(f"d{i}", [1], ctx - 1, ((),), False, True, p, 1)

    prefill = ScheduledRequest("p", [1] * 8192, 0, ((),), False, True, p, 0)
    cpu = [decode(i, 512) for i in range(4)]
    # An 8,192-token prefill on the GPU hides 4 x 512 tokens of CPU attention and the split's
    # launch cost (NEO's 0.8 ms a layer)...
    assert rule.pipelined([*cpu, prefill], 4, 4 * 512)
    # ...but not 64 x 8,192, and a batch of CPU decodes alone hides nothing.
    many = [decode(i, 8192) for i in range(64)]
    assert not rule.pipelined([*many, prefill], 64, 64 * 8192)
    assert not rule.pipelined(cpu, 4, 4 * 512)


def test_the_pipeline_flag_is_checked():
    with pytest.raises(ConfigError, match="--neo-pipeline"):
        EngineArgs(model="tiny-llama", kv_policy="neo", neo_pipeline="sometimes"
                   ).create_engine_config()
