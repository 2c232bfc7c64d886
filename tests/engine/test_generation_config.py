"""The model's generation_config.json, as vLLM reads it (`--generation-config auto`): default
sampling for the fields a request leaves unset, and the end tokens it lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvtier.config import ConfigError, GenerationDefaults
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.entrypoints.llm import LLM
from kvtier.model.generation_config import load_generation_defaults, parse_override
from kvtier.model.presets import PRESETS
from kvtier.sampling_params import SamplingParams

# Llama 3 Instruct's file: its chat turn's end (128009) beside the text's; top_k 50 is
# transformers' own default, so not a choice of the model's.
LLAMA3 = {"bos_token_id": 128000, "do_sample": True, "eos_token_id": [128001, 128009],
          "temperature": 0.6, "top_p": 0.9, "top_k": 50}
OPTIONS = dict(load_format="dummy", device="cpu", attention_backend="torch", num_gpu_blocks=64,
               max_model_len=128)


def _model_dir(tmp: Path, generation: dict | None) -> Path:
    (tmp / "config.json").write_text(json.dumps({**PRESETS["tiny-llama"], "vocab_size": 2048}))
    if generation is not None:
        (tmp / "generation_config.json").write_text(json.dumps(generation))
    return tmp


def test_the_files_choices_and_end_tokens(tmp_path):
    d = load_generation_defaults("auto", _model_dir(tmp_path, LLAMA3))
    assert d == GenerationDefaults(sampling=(("temperature", 0.6), ("top_p", 0.9)),
                                   eos_token_ids=(128001, 128009))
    assert load_generation_defaults("vllm", tmp_path) == GenerationDefaults()
    assert load_generation_defaults("auto", None) == GenerationDefaults()  # a preset: no folder
    assert load_generation_defaults("auto", tmp_path / "none") == GenerationDefaults()


def test_the_override_wins_and_a_folder_may_be_named(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "generation_config.json").write_text(json.dumps({"max_new_tokens": 7, "min_p": 0.1}))
    d = load_generation_defaults(str(other), None, parse_override('{"min_p": 0.2, "top_k": 5}'))
    assert dict(d.sampling) == {"max_tokens": 7, "min_p": 0.2, "top_k": 5}


@pytest.mark.parametrize("source, override, message", [
    ("auto", '{"temperature": -1}', "temperature"),
    ("auto", '{"beams": 2}', "unknown field"),
    ("auto", '[1]', "JSON object"),
    ("auto", '{', "not JSON"),
    ("/no/such/folder", None, "no generation_config.json"),
])
def test_bad_settings_are_refused_at_start(tmp_path, source, override, message):
    with pytest.raises(ConfigError, match=message):
        load_generation_defaults(source, _model_dir(tmp_path, None), parse_override(override))


def test_the_engine_stops_on_the_files_end_tokens(tmp_path):
    plain = LLMEngine.from_engine_args(EngineArgs(model=str(_model_dir(tmp_path, None)), **OPTIONS))
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    plain.add_request("a", [5, 6, 7], greedy)
    tokens = [o for o in _run(plain) if o.finished][0].outputs[0].token_ids
    end = tokens[3]
    assert end not in tokens[:3], "pick a prompt whose fourth token is new"
    _model_dir(tmp_path, {"eos_token_id": [end]})
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), **OPTIONS))
    assert end in engine.model_config.eos_token_ids
    engine.add_request("b", [5, 6, 7], greedy)
    out = [o for o in _run(engine) if o.finished][0].outputs[0]
    assert out.token_ids == tokens[:4] and out.finish_reason == "stop"
    ignored = LLMEngine.from_engine_args(EngineArgs(model=str(tmp_path), generation_config="vllm",
                                                    **OPTIONS))
    assert end not in ignored.model_config.eos_token_ids


def _run(engine):
    outs = []
    while engine.has_unfinished_requests():
        outs += engine.step()
    return outs


def test_offline_generate_samples_with_the_models_defaults(tmp_path):
    llm = LLM(str(_model_dir(tmp_path, {"temperature": 0.0, "max_new_tokens": 3})), **OPTIONS)
    assert llm.get_default_sampling_params() == SamplingParams(temperature=0.0, max_tokens=3)
    out = llm.generate([[5, 6, 7]])[0].outputs[0]
    assert len(out.token_ids) == 3

