"""Launch flags of vLLM and SGLang that are not a field's alias (those sit in the fields'
metadata, kvtier/engine/args.py), so that a command written for either engine runs here:

  * SGLang's `--model-path M` in place of the positional MODEL, and `--disable-radix-cache`
    for `--no-enable-prefix-caching`;
  * vLLM flags with nothing to change here, accepted and said so: `--trust-remote-code`
    (kvtier runs only its built-in architectures: there is no model code to trust) and
    `--kv-cache-dtype auto` (the KV cache is in the model's dtype; an fp8 cache is refused).
"""

from __future__ import annotations

import argparse
import logging

from kvtier.config import ConfigError

logger = logging.getLogger("kvtier")

KV_CACHE_DTYPES = ("auto",)  # the model's dtype; vLLM's fp8 caches are not built


def add_other_flags(parser: argparse.ArgumentParser, model_path_flag: bool) -> None:
    if model_path_flag:
        parser.add_argument("--model-path", dest="model_path", default=None,
                            help="the model, as SGLang's flag gives it (in place of MODEL)")
    # SUPPRESS: unset, it leaves --enable-prefix-caching's default (None: the engine decides)
    parser.add_argument("--disable-radix-cache", dest="enable_prefix_caching",
                        action="store_false", default=argparse.SUPPRESS,
                        help="SGLang's name for --no-enable-prefix-caching")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="accepted for vLLM's and SGLang's commands; kvtier runs only its "
                        "built-in architectures, so there is no model code to trust")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto",
                        help="the KV cache's dtype: auto, the model's (fp8 caches are not "
                        "supported)")


def model_from_args(ns: argparse.Namespace) -> str:
    """The model from MODEL or --model-path: exactly one of them."""
    positional, flag = getattr(ns, "model", None), getattr(ns, "model_path", None)
    if positional is not None and flag is not None and positional != flag:
        raise ConfigError(f"two models given: MODEL {positional!r} and --model-path {flag!r}")
    model = positional if positional is not None else flag
    if model is None:
        raise ConfigError("give the model: MODEL, or --model-path")
    if getattr(ns, "trust_remote_code", False):
        logger.info("--trust-remote-code: kvtier runs only its built-in architectures; "
                    "nothing is loaded from the model's folder but weights and tokenizer")
    return model
