"""Structured outputs on a real instruct model (SmolLM2-135M-Instruct, tests/real_model.py):
the grammar keeps the model's own choice where it allows it, and a schema gets JSON the
model fills with its own words."""

from __future__ import annotations

import json

import pytest

from kvtier import LLM, SamplingParams
from tests.real_model import smollm2_dir_or_fail

pytest.importorskip("xgrammar")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                           "country": {"type": "string", "maxLength": 20}},
          "required": ["city", "country"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    return LLM(smollm2_dir_or_fail(), device="cpu", dtype="float32", max_model_len=256)


def chat(llm: LLM, question: str, **params) -> tuple[str, str]:
    prompt = llm.get_tokenizer().apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True)
    out = llm.generate([{"prompt_token_ids": prompt}],
                       SamplingParams(temperature=0.0, max_tokens=80, **params))[0].outputs[0]
    llm.engine.check_integrity()
    return out.text, out.finish_reason


def test_a_choice_keeps_the_models_own_answer(llm):
    free, _ = chat(llm, "What is the capital of France? Answer in one word.")
    assert "Paris" in free
    held, reason = chat(llm, "What is the capital of France? Answer in one word.",
                        structured_outputs={"choice": ["London", "Paris", "Rome"]})
    assert (held, reason) == ("Paris", "stop")


def test_a_schema_gets_valid_json_with_the_models_words(llm):
    text, reason = chat(llm, "Name the capital of France and its country, as JSON.",
                        structured_outputs={"json": SCHEMA, "disable_any_whitespace": True})
    assert reason == "stop"
    value = json.loads(text)
    assert set(value) == {"city", "country"} and "Paris" in value["city"]
