"""DirectKV's flags and its attention adapter: without the zero-copy kernel's module (or on
the CPU) the host-page attention is the torch reference's, exactly."""

from __future__ import annotations

import pytest
import torch

from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.kernels.cpu_attention import cpu_decode_attention_reference
from kvtier.policies.directkv import host_attention as adapter
from kvtier.policies.host_resident import HostResidentOptions


def test_its_flags_parse_into_its_options():
    ns = build_parser().parse_args(["generate", "tiny-llama", "hi", "--kv-policy", "directkv",
                                    "--directkv-swap-in-fraction", "0.8"])
    options = EngineArgs.from_cli_args(ns).create_engine_config().policy_options
    assert isinstance(options, HostResidentOptions) and options.swap_in_fraction == 0.8
    with pytest.raises(ConfigError, match="--directkv-swap-in-fraction"):
        EngineArgs(model="tiny-llama", kv_policy="neo", directkv_swap_in_fraction=0.5
                   ).create_engine_config()


@pytest.mark.parametrize("flag,field", [("side-stream", "side_stream"),
                                        ("graphs", "graphs")])
def test_the_runner_flags_are_on_by_default_and_only_for_directkv(flag, field):
    parse = build_parser().parse_args
    on = parse(["generate", "tiny-llama", "hi", "--kv-policy", "directkv"])
    off = parse(["generate", "tiny-llama", "hi", "--kv-policy", "directkv",
                 f"--no-directkv-{flag}"])
    assert getattr(EngineArgs.from_cli_args(on).create_engine_config().policy_options, field)
    assert not getattr(EngineArgs.from_cli_args(off).create_engine_config().policy_options,
                       field)
    with pytest.raises(ConfigError, match=f"--directkv-{flag}"):
        EngineArgs(model="tiny-llama", kv_policy="neo", **{f"directkv_{field}": False}
                   ).create_engine_config()


def test_a_host_pool_of_nothing_is_refused():
    from kvtier.entrypoints.llm import LLM

    with pytest.raises(ConfigError, match="host pool"):
        LLM(model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
            kv_policy="directkv", num_gpu_blocks=16, num_host_blocks=0, max_model_len=256)


def test_the_adapter_is_the_reference_on_the_cpu():
    g = torch.Generator().manual_seed(0)
    pages = torch.randn(6, 2, 2, 4, 16, generator=g)  # [P, K/V, Hkv, page, D]
    k, v = pages[:, 0], pages[:, 1]
    q = torch.randn(2, 4, 16, generator=g)
    tables = torch.tensor([[3, 1, 0], [5, 2, 4]], dtype=torch.int32)
    lens = torch.tensor([9, 12], dtype=torch.int32)
    out, lse = adapter.host_attention(q, k, v, tables, lens, 0.25)
    ref_out, ref_lse = cpu_decode_attention_reference(q, k, v, tables, lens, 0.25)
    assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)


def test_without_the_kernel_module_the_adapter_says_so_once(caplog, monkeypatch):
    monkeypatch.setattr(adapter, "KERNEL_MODULE", "kvtier.kernels.no_such_module")
    adapter._kernel.cache_clear()
    try:
        with caplog.at_level("INFO", logger="kvtier"):
            assert adapter._kernel() is None and adapter._kernel() is None
        assert sum("absent" in r.message for r in caplog.records) == 1
    finally:
        adapter._kernel.cache_clear()


def test_the_host_resident_bench_spells_each_systems_mode():
    from benchmarks.policies.bench_host_resident import parse_args, policy_flags

    args = parse_args([])
    assert policy_flags(args, "directkv:inline@0") == (
        "directkv", {"directkv_side_stream": False, "directkv_balance": 0.0})
    assert policy_flags(args, "directkv:inline+piecewise") == (
        "directkv", {"directkv_side_stream": False, "directkv_graphs": False})
    assert policy_flags(args, "directkv:partial@0") == (
        "directkv", {"directkv_partial_moves": True, "directkv_balance": 0.0})
    assert policy_flags(args, "neo:off") == ("neo", {"neo_pipeline": "off"})
    assert policy_flags(args, "swap") == ("swap", {})
