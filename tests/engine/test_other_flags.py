"""vLLM's and SGLang's launch flags on kvtier's commands: SGLang's spellings of the same
options set the same fields, vLLM's flags with nothing to change are accepted, and what
kvtier cannot do is refused by name."""

from __future__ import annotations

import pytest

from kvtier.cli import build_parser
from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs

SGLANG = ["--model-path", "tiny-llama", "--context-length", "512", "--page-size", "32",
          "--max-running-requests", "8", "--mem-fraction-static", "0.8", "--random-seed", "3",
          "--tp-size", "2", "--disable-radix-cache"]
VLLM = ["tiny-llama", "--max-model-len", "512", "--block-size", "32", "--max-num-seqs", "8",
        "--gpu-memory-utilization", "0.8", "--seed", "3", "--tensor-parallel-size", "2",
        "--no-enable-prefix-caching", "--trust-remote-code", "--kv-cache-dtype", "auto"]


def _engine_args(*argv: str) -> EngineArgs:
    return EngineArgs.from_cli_args(build_parser().parse_args(list(argv)))


def test_sglangs_spellings_set_what_vllms_set():
    assert _engine_args("serve", *SGLANG) == _engine_args("serve", *VLLM)


def test_unset_prefix_caching_stays_the_engines_choice():
    assert _engine_args("serve", "tiny-llama").enable_prefix_caching is None
    assert _engine_args("serve", "tiny-llama", "--enable-prefix-caching").enable_prefix_caching


def test_the_model_comes_once():
    with pytest.raises(ConfigError, match="give the model"):
        _engine_args("serve")
    with pytest.raises(ConfigError, match="two models"):
        _engine_args("serve", "tiny-llama", "--model-path", "tiny-qwen2")
    assert _engine_args("serve", "tiny-llama", "--model-path", "tiny-llama").model == "tiny-llama"
    args = build_parser().parse_args(["generate", "tiny-llama", "hi", "there"])
    assert EngineArgs.from_cli_args(args).model == "tiny-llama" and args.prompts == ["hi", "there"]


def test_an_fp8_kv_cache_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "tiny-llama", "--kv-cache-dtype", "fp8"])
    assert "--kv-cache-dtype" in capsys.readouterr().err
