"""vLLM's --chat-template: a file or the Jinja text replaces the tokenizer's template, for
the HF tokenizer and the dummy models' BPE alike; a path that names no file is refused."""

from __future__ import annotations

import pytest

from kvtier.config import ConfigError
from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.tokenizer import read_chat_template
from tests.engine.test_chat_special_tokens import save_chatml_tokenizer

PLAIN = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}>"
MESSAGES = [{"role": "user", "content": "hello world"}]


def engine(**kw) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model="tiny-llama", load_format="dummy",
                                                 device="cpu", max_model_len=64, **kw))


def test_inline_template_on_the_dummy_tokenizer():
    tok = engine(chat_template=PLAIN).tokenizer
    assert tok.decode(tok.apply_chat_template(MESSAGES)) == "[user] hello world\n>"


def test_template_file_on_an_hf_tokenizer(tmp_path):
    save_chatml_tokenizer(tmp_path / "tok")
    (tmp_path / "plain.jinja").write_text(PLAIN)
    tok = engine(tokenizer=str(tmp_path / "tok"), chat_template=str(tmp_path / "plain.jinja")).tokenizer
    assert tok.decode(tok.apply_chat_template(MESSAGES)) == "[user] hello world\n>"


@pytest.mark.parametrize("value,match", [("no/such/file.jinja", "no such file"),
                                          ("{% for x in %}", "not a valid Jinja")])
def test_bad_values_are_refused(value, match):
    with pytest.raises(ConfigError, match=match):
        read_chat_template(value)


def test_cli_flag():
    import argparse

    parser = argparse.ArgumentParser()
    EngineArgs.add_cli_args(parser)
    args = EngineArgs.from_cli_args(parser.parse_args(["tiny-llama", "--chat-template", PLAIN]))
    assert args.chat_template == PLAIN
