"""vLLM's return_tokens_as_token_ids (the request field, and the server's
--return-tokens-as-token-ids for requests that leave it unset): logprobs name each token
"token_id:{id}" in completions (tokens, top_logprobs, echoed prompt tokens, text offsets
by those names) and chat (token, bytes, top_logprobs), whole or streamed; the ids are the
tokens generated."""

from __future__ import annotations

import pytest

from kvtier.cli import build_parser
from kvtier.server.app import build_app
from tests.server.conftest import openai_client, serve_until_clean
from tests.server.test_openai_client import MESSAGES, MODEL, PROMPT


@pytest.fixture(scope="module")
def as_ids_server(engine):
    yield from serve_until_clean(build_app(engine, return_tokens_as_token_ids=True))


def _ids(names: list[str]) -> list[int]:
    assert all(n.startswith("token_id:") for n in names), names
    return [int(n.removeprefix("token_id:")) for n in names]


def test_completion_tokens_are_named_by_id(live):
    extra = {"ignore_eos": True, "return_token_ids": True, "return_tokens_as_token_ids": True}
    with openai_client(live) as client:
        got = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0,
                                        logprobs=2, extra_body=extra).choices[0]
        assert _ids(got.logprobs.tokens) == got.model_extra["token_ids"]
        for top in got.logprobs.top_logprobs:
            _ids(list(top))
        offsets = [0]
        for name in got.logprobs.tokens[:-1]:
            offsets.append(offsets[-1] + len(name))
        assert got.logprobs.text_offset == offsets
        streamed = [t for c in client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2, stream=True,
            extra_body=extra) if c.choices and c.choices[0].logprobs
            for t in c.choices[0].logprobs.tokens]
        assert streamed == got.logprobs.tokens
        echoed = client.completions.create(model=MODEL, prompt=[11, 12, 13], max_tokens=2,
                                           temperature=0, logprobs=1, echo=True,
                                           extra_body=extra).choices[0]
        assert _ids(echoed.logprobs.tokens)[:3] == [11, 12, 13]
        plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5,
                                          temperature=0, logprobs=2,
                                          extra_body={"ignore_eos": True}).choices[0]
        assert not any(t.startswith("token_id:") for t in plain.logprobs.tokens)


def test_chat_tokens_are_named_by_id_by_the_servers_default(as_ids_server):
    with openai_client(as_ids_server) as client:
        kw = dict(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0, logprobs=True,
                  top_logprobs=2, extra_body={"ignore_eos": True, "return_token_ids": True})
        got = client.chat.completions.create(**kw).choices[0]
        content = got.logprobs.content
        assert _ids([c.token for c in content]) == got.model_extra["token_ids"]
        assert all(bytes(c.bytes).decode() == c.token for c in content)
        assert all(_ids([t.token for t in c.top_logprobs]) for c in content)
        # the request's field overrides the server's default
        off = client.chat.completions.create(**{**kw, "extra_body": {
            "ignore_eos": True, "return_tokens_as_token_ids": False}}).choices[0]
        assert not any(c.token.startswith("token_id:") for c in off.logprobs.content)


def test_the_flag_parses():
    args = build_parser().parse_args(["serve", MODEL, "--return-tokens-as-token-ids"])
    assert args.return_tokens_as_token_ids is True
