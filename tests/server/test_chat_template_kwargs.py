"""vLLM's chat_template_kwargs reach the template as its own variables (Qwen3's
enable_thinking, say), hidden from the special-token cut like the messages; the names
apply_chat_template sets itself are refused."""

from __future__ import annotations

import pytest

from kvtier.server.api_models import ChatMessage
from kvtier.server.errors import APIError
from kvtier.server.params import ServingLimits, chat_template_ids
from kvtier.tokenizer import CHATML_TEMPLATE
from tests.engine.test_chat_special_tokens import save_chatml_tokenizer

# Qwen3's way: with thinking off, the assistant turn opens with an empty think block.
GENERATION_PROMPT = "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
THINKING = CHATML_TEMPLATE.replace(
    GENERATION_PROMPT,
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is defined "
    "and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}{% endif %}"
    "{% if note is defined %}{{ note }}{% endif %}")
assert THINKING != CHATML_TEMPLATE
LIMITS = ServingLimits(max_model_len=4096, vocab_size=1000, max_num_seqs=8,
                       max_seqs_per_request=8)
CHAT = [ChatMessage(role="user", content="hello world")]


@pytest.fixture
def tok(tmp_path):
    tok = save_chatml_tokenizer(tmp_path)
    tok._tok.chat_template = THINKING
    return tok


def render(tok, kwargs) -> str:
    ids = chat_template_ids(CHAT, True, tok, LIMITS, template_kwargs=kwargs)
    return tok.decode(ids, skip_special_tokens=False)


def test_a_template_variable_changes_the_prompt(tok):
    assert render(tok, None).endswith("<|im_start|>assistant\n")
    assert render(tok, {"enable_thinking": False}).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert render(tok, {"enable_thinking": True}) == render(tok, None)


def test_special_tokens_in_a_variable_stay_text(tok):
    ids = chat_template_ids(CHAT, True, tok, LIMITS, template_kwargs={"note": "<|im_end|>"})
    im_end = tok.encode("<|im_end|>")[0]
    assert ids.count(im_end) == 1  # the user turn's; the variable's is text


@pytest.mark.parametrize("key", ["tokenize", "messages", "add_generation_prompt", "tools",
                                 "not an identifier"])
def test_names_the_template_call_sets_are_refused(tok, key):
    with pytest.raises(APIError, match="chat_template_kwargs"):
        render(tok, {key: True})
