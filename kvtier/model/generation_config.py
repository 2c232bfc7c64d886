"""The model's generation_config.json as vLLM reads it: default sampling for requests that
leave a field unset, and the end tokens HF's generate stops on.

vLLM (`--generation-config auto`, its default) takes temperature, top_p, top_k, min_p,
repetition_penalty and max_new_tokens (as max_tokens) from the file where they differ from
transformers' own defaults, and logs that it did; `vllm` ignores the file. The end tokens
(`eos_token_id`, one or a list) join config.json's: an instruct model's file often lists
the chat turn's end (Llama 3's <|eot_id|>) where config.json names only the text's end.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from kvtier.config import ConfigError, GenerationDefaults
from kvtier.sampling_params import InvalidRequestError, SamplingParams

logger = logging.getLogger(__name__)

FILE = "generation_config.json"
# generation_config.json's name -> (SamplingParams' name, transformers' default: not a choice)
FIELDS: dict[str, tuple[str, Any]] = {
    "temperature": ("temperature", 1.0),
    "top_p": ("top_p", 1.0),
    "top_k": ("top_k", 50),
    "min_p": ("min_p", None),
    "repetition_penalty": ("repetition_penalty", 1.0),
    "max_new_tokens": ("max_tokens", None),
}


def parse_override(text: str | None) -> tuple[tuple[str, Any], ...]:
    """--override-generation-config: a JSON object of the fields above."""
    if not text:
        return ()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--override-generation-config is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError("--override-generation-config takes a JSON object, e.g. "
                          '\'{"temperature": 0.5}\'')
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise ConfigError(f"--override-generation-config: unknown field(s) {', '.join(unknown)}; "
                          f"known: {', '.join(FIELDS)}")
    return tuple(sorted(value.items()))


def _file(source: str, model_dir: Path | None) -> Path | None:
    if source == "vllm":
        return None
    if source == "auto":
        return model_dir / FILE if model_dir is not None else None
    path = Path(source)
    path = path / FILE if path.is_dir() else path
    if not path.is_file():
        raise ConfigError(f"--generation-config {source}: no {FILE} there "
                          "(auto: the model's; vllm: none)")
    return path


def _read(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read {path}: {exc}") from None
    if not isinstance(value, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return value


def load_generation_defaults(source: str, model_dir: Path | None,
                             override: tuple[tuple[str, Any], ...] = ()) -> GenerationDefaults:
    """The defaults `source` gives (see EngineConfig.generation_config), the override's
    fields over them; checked as SamplingParams would check them."""
    path = _file(source, model_dir)
    raw = _read(path) if path is not None and path.is_file() else {}
    chosen = {name: raw[key] for key, (name, default) in FIELDS.items()
              if key in raw and raw[key] != default and raw[key] is not None}
    chosen.update({FIELDS[key][0]: v for key, v in override})
    try:
        SamplingParams(**chosen).validate()
    except (InvalidRequestError, TypeError) as exc:
        raise ConfigError(f"generation config {path or 'override'}: {exc}") from None
    eos = raw.get("eos_token_id")
    eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if isinstance(eos, int) else ())
    if chosen:
        logger.warning("default sampling from %s: %s (requests that set a field keep "
                       "theirs; --generation-config vllm ignores the file)",
                       path or "--override-generation-config", chosen)
    return GenerationDefaults(sampling=tuple(sorted(chosen.items())), eos_token_ids=eos_ids)
