"""vLLM's continue_final_message ("prefill": the reply continues the last assistant message)
and chat echo, through both tokenizer kinds and the server."""

from __future__ import annotations

import openai
import pytest

from kvtier.server.app import build_app
from kvtier.tokenizer import BPETokenizer
from tests.engine.test_chat_special_tokens import save_chatml_tokenizer
from tests.server.conftest import MODEL, make_engine, openai_client, serve_until_clean

PARTIAL = [{"role": "user", "content": "Name a colour."},
           {"role": "assistant", "content": "The colour is"}]


@pytest.mark.parametrize("kind", ["bpe", "hf"])
def test_the_final_message_is_left_open(kind, tmp_path):
    tok = BPETokenizer(32000) if kind == "bpe" else save_chatml_tokenizer(tmp_path)
    closed = tok.decode(tok.apply_chat_template(PARTIAL, add_generation_prompt=False),
                        skip_special_tokens=False)
    opened = tok.decode(tok.apply_chat_template(PARTIAL, add_generation_prompt=False,
                                                continue_final_message=True),
                        skip_special_tokens=False)
    assert closed.endswith("The colour is<|im_end|>\n")
    assert opened.endswith("<|im_start|>assistant\nThe colour is")
    assert closed.startswith(opened)


@pytest.fixture(scope="module")
def live(tiny_model_dir):
    yield from serve_until_clean(build_app(make_engine(tiny_model_dir)))


@pytest.fixture(scope="module")
def client(live):
    with openai_client(live) as c:
        yield c


def chat(client, **kw):
    kw = {"model": MODEL, "messages": PARTIAL, "max_tokens": 6, "temperature": 0,
          "extra_body": {"ignore_eos": True, "add_generation_prompt": False,
                         "continue_final_message": True, **kw.pop("extra", {})}, **kw}
    return client.chat.completions.create(**kw)


def test_the_reply_continues_the_message(live, client):
    out = chat(client)
    ids = live.engine.tokenizer.apply_chat_template(PARTIAL, add_generation_prompt=False,
                                                    continue_final_message=True)
    assert out.usage.prompt_tokens == len(ids)
    same = client.completions.create(model=MODEL, prompt=ids, max_tokens=6, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert out.choices[0].message.content == same.choices[0].text


def test_echo_puts_the_message_first_streamed_or_not(client):
    plain = chat(client).choices[0].message.content
    whole = chat(client, extra={"echo": True}).choices[0].message.content
    assert whole == "The colour is" + plain
    chunks = list(chat(client, stream=True, extra={"echo": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole


def test_refusals(client):
    with pytest.raises(openai.BadRequestError, match="add_generation_prompt false"):
        chat(client, extra={"add_generation_prompt": True})
    with pytest.raises(openai.BadRequestError, match="does not appear"):
        chat(client, messages=[{"role": "user", "content": "hi"},
                               {"role": "assistant", "content": ""}])
