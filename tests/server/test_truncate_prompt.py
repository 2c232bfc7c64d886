"""vLLM's truncate_prompt_tokens: a prompt keeps only its last k tokens (-1: max_model_len),
checked before the tokenizer sees it, in completions and chat alike."""

from __future__ import annotations

import openai
import pytest

from tests.server.conftest import MODEL, assert_engine_clean, openai_client


@pytest.fixture(scope="module")
def client(live):
    with openai_client(live) as c:
        yield c


def _complete(client, prompt, k, **kw):
    return client.completions.create(model=MODEL, prompt=prompt, max_tokens=2, temperature=0,
                                     extra_body={"truncate_prompt_tokens": k, "ignore_eos": True},
                                     **kw)


def test_only_the_last_k_tokens_are_kept(live, client):
    ids = list(range(100, 160))
    cut = _complete(client, ids, 12, echo=True)
    tail = client.completions.create(model=MODEL, prompt=ids[-12:], max_tokens=2, temperature=0,
                                     echo=True, extra_body={"ignore_eos": True})
    assert cut.usage.prompt_tokens == 12
    assert cut.choices[0].text == tail.choices[0].text  # the echoed tail, then the same reply
    assert _complete(client, ids[:5], 12).usage.prompt_tokens == 5  # shorter: kept whole
    assert_engine_clean(live)


def test_a_prompt_longer_than_the_model_takes_is_cut_not_refused(live, client):
    max_len = live.engine.config.scheduler.max_model_len
    text = "word " * (40 * max_len)  # over the untokenized bound (max_model_len x longest token)
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt=text, max_tokens=2)
    out = _complete(client, text, max_len - 2)
    assert out.usage.prompt_tokens == max_len - 2
    with pytest.raises(openai.BadRequestError, match="maximum context length"):
        _complete(client, text, -1)  # all max_model_len tokens: no room left for the reply


def test_chat_prompts_are_cut_too(client):
    messages = [{"role": "user", "content": "tell me " * 50}]
    out = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                         extra_body={"truncate_prompt_tokens": 20})
    assert out.usage.prompt_tokens == 20


@pytest.mark.parametrize("k", [0, -2, 10_000, 1.5])
def test_bad_sizes_are_400s_naming_the_field(client, k):
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, "hello", k)
    assert err.value.body["param"] == "truncate_prompt_tokens"
