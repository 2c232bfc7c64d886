"""The host tier's flags: both spellings of the size, the ratio, SGLang's layout names, and
the errors that name the option."""

from __future__ import annotations

import argparse

import pytest

from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.kernels.host_page_backends import IOBackend
from kvtier.kernels.host_page_io import HostPageLayout
from kvtier.kv.host_tier import WritePolicy
from kvtier.offload.args import GiB, HostTierArgs


def parse(*flags: str) -> HostTierArgs:
    p = argparse.ArgumentParser()
    EngineArgs.add_cli_args(p)
    return EngineArgs.from_cli_args(p.parse_args(["tiny-llama", *flags])).host_tier


def test_off_by_default_and_both_size_spellings_turn_it_on():
    assert not parse().enabled
    for flag in ("--kv-offloading-size", "--hicache-size"):
        a = parse(flag, "2.5")
        assert a.enabled and a.kv_offloading_size == 2.5
        assert a.resolve(num_gpu_blocks=100, page_bytes=GiB // 4).tier.num_pages == 10


def test_the_ratio_and_the_bare_switch_size_by_the_device_pool():
    assert parse("--hicache-ratio", "3").resolve(100, 1 << 20).tier.num_pages == 300
    assert parse("--enable-hierarchical-cache").resolve(100, 1 << 20).tier.num_pages == 200
    with pytest.raises(ConfigError, match="not both"):
        parse("--hicache-size", "1", "--hicache-ratio", "2").resolve(100, 1 << 20)


def test_policy_backend_and_layouts_in_sglangs_words():
    o = parse("--hicache-size", "1", "--hicache-write-policy", "write_through_selective",
              "--hicache-write-through-threshold", "3", "--hicache-io-backend", "direct",
              "--hicache-mem-layout", "page_first_direct").resolve(100, 1 << 20)
    assert o.tier.write_policy is WritePolicy.WRITE_THROUGH_SELECTIVE
    assert o.tier.selective_hits == 3
    assert (o.io.backend, o.io.layout) == (IOBackend.DIRECT, HostPageLayout.BLOCK)
    default = parse("--hicache-size", "1").resolve(100, 1 << 20)
    assert (default.io.backend, default.io.layout) == (IOBackend.DIRECT, HostPageLayout.BLOCK)
    kernel = parse("--hicache-size", "1", "--hicache-io-backend", "kernel").resolve(100, 1 << 20)
    assert (kernel.io.backend, kernel.io.layout) == (IOBackend.KERNEL, HostPageLayout.HEAD_MAJOR)
    assert kernel.io.load_programs == HostTierArgs().hicache_load_programs
    assert parse("--hicache-size", "1", "--hicache-io-backend", "kernel",
                 "--hicache-load-programs", "4").resolve(100, 1 << 20).io.load_programs == 4
    for name, layout in (("page_head", HostPageLayout.HEAD_MAJOR),
                         ("page_first", HostPageLayout.HEAD_MAJOR),
                         ("block", HostPageLayout.BLOCK)):
        assert parse("--hicache-size", "1", "--hicache-io-backend", "kernel",
                     "--hicache-mem-layout", name).resolve(100, 1 << 20).io.layout is layout


def test_bad_values_are_refused_naming_the_flag():
    with pytest.raises(ConfigError, match="--kv-offloading-size must be > 0"):
        parse("--hicache-size", "0").resolve(100, 1 << 20)
    with pytest.raises(ConfigError, match="--hicache-loading-bound"):
        parse("--hicache-size", "1", "--hicache-loading-bound", "-1").resolve(100, 1 << 20)
    with pytest.raises(ConfigError, match="--hicache-load-programs must be >= 1, got 0"):
        parse("--hicache-size", "1", "--hicache-load-programs", "0").resolve(100, 1 << 20)
    with pytest.raises(ConfigError, match="selective_hits"):
        parse("--hicache-size", "1", "--hicache-write-through-threshold", "0").resolve(
            100, 1 << 20)
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        parse("--hicache-write-policy", "write_around")


def test_the_python_api_takes_the_options_by_keyword_in_both_spellings():
    """vLLM's LLM(kv_offloading_size=...) and SGLang's hicache_size=... reach the host tier,
    read and written as EngineArgs attributes like the command line's."""
    a = EngineArgs(model="tiny-llama", kv_offloading_size=2.5, hicache_write_policy="write_back")
    assert a.host_tier.enabled and a.kv_offloading_size == 2.5
    assert a.host_tier.hicache_write_policy == "write_back"
    assert EngineArgs(model="tiny-llama", hicache_size=1.5).host_tier.kv_offloading_size == 1.5
    a.hicache_io_backend = "kernel"
    assert a.host_tier.hicache_io_backend == "kernel" and a.kv_offloading_size == 2.5
    assert not EngineArgs(model="tiny-llama").kv_offloading_size
    with pytest.raises(TypeError, match="twice"):
        EngineArgs(model="tiny-llama", hicache_size=1.0, kv_offloading_size=2.0)
    with pytest.raises(TypeError, match="one or the other"):
        EngineArgs(model="tiny-llama", kv_offloading_size=1.0, host_tier=HostTierArgs())
    with pytest.raises(TypeError, match="kv_offloading_sizes"):
        EngineArgs(model="tiny-llama", kv_offloading_sizes=1.0)


def test_the_offline_llm_serves_hits_from_the_host_tier_given_by_keyword():
    from kvtier import LLM, SamplingParams

    llm = LLM(model="tiny-llama", load_format="dummy", device="cpu", dtype="float32",
              num_gpu_blocks=16, max_model_len=256, kv_offloading_size=0.01,
              hicache_min_load_blocks=2)
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True)
    first = [list(range(100 + 40 * i, 140 + 40 * i)) * 2 for i in range(6)]
    want = [o.outputs[0].token_ids for o in llm.generate(first, params)]
    llm.generate([list(range(3000, 3150))], params)  # evicts the first prompts' device blocks
    got = [o.outputs[0].token_ids for o in llm.generate(first, params)]
    stats = llm.engine.get_stats().host_tier
    assert got == want and stats is not None and stats.host_hit_tokens > 0


def test_vllms_offloading_backend_flag_takes_native_and_refuses_lmcache_clearly():
    assert parse("--kv-offloading-backend", "native", "--kv-offloading-size", "1").enabled
    with pytest.raises(SystemExit):
        parse("--kv-offloading-backend", "lmcache")
    with pytest.raises(ConfigError, match="no LMCache connector"):
        EngineArgs(model="tiny-llama", kv_offloading_size=1.0, kv_offloading_backend="lmcache")
