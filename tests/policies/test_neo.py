"""NEO's flags, its refusal of a config it cannot serve, and its CPU attention running on
the worker thread (not the Python main thread) during an engine's steps."""

from __future__ import annotations

import threading

import pytest

import kvtier.kernels.cpu_attention as cpu_attention
from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
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


def test_fp16_kv_is_refused():
    from kvtier.engine.assembly import check_config

    config = EngineArgs(model="tiny-llama", load_format="dummy", kv_policy="neo",
                        dtype="float16").create_engine_config()
    with pytest.raises(ConfigError, match="bf16 or fp32"):
        check_config(config)


def test_the_cpu_attention_runs_on_the_worker_thread(monkeypatch):
    threads: set[str] = set()
    real = cpu_attention.cpu_decode_attention

    def recording(*args, **kwargs):
        threads.add(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(cpu_attention, "cpu_decode_attention", recording)
    _, engine, host_steps = run("neo")
    assert host_steps > 0 and threads
    assert all(name.startswith("cpu-attention") for name in threads)
    assert threading.main_thread().name not in threads
