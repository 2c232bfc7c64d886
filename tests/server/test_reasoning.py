"""--reasoning-parser: a chat reply's thinking as reasoning_content, whole and streamed
alike, in pieces of every size, and through the server."""

from __future__ import annotations

import pytest

from kvtier.server.app import build_app
from kvtier.server.reasoning import REASONING_PARSERS
from tests.server.conftest import MODEL, make_engine, openai_client, serve_until_clean

REPLIES = {  # text: {parser: (reasoning, content)}
    "<think>\nhmm</think>\n\nAnswer.": {"qwen3": ("\nhmm", "\n\nAnswer."),
                                       "deepseek_r1": ("\nhmm", "\n\nAnswer.")},
    "Answer only.": {"qwen3": (None, "Answer only."), "deepseek_r1": ("Answer only.", None)},
    "thinking</think>Yes": {"qwen3": (None, "thinking</think>Yes"),
                            "deepseek_r1": ("thinking", "Yes")},
    "<think>cut sh": {"qwen3": ("cut sh", None), "deepseek_r1": ("cut sh", None)},
    "  <think>a</think>b": {"qwen3": ("a", "b"), "deepseek_r1": ("a", "b")},
    "<thi": {"qwen3": (None, "<thi"), "deepseek_r1": ("<thi", None)},
    "<think></think>x": {"qwen3": (None, "x"), "deepseek_r1": (None, "x")},
    "": {"qwen3": (None, None), "deepseek_r1": (None, None)},
}


@pytest.mark.parametrize("name", sorted(REASONING_PARSERS))
@pytest.mark.parametrize("text", sorted(REPLIES))
def test_whole_and_streamed_in_pieces(name, text):
    parser = REASONING_PARSERS[name]
    assert parser.parse(text) == REPLIES[text][name]
    for size in (1, 2, 3, 5, 100):
        stream, reasoning, content = parser.stream(), [], []
        for i in range(0, len(text), size):
            r, c = stream.feed(text[i:i + size])
            reasoning.append(r)
            content.append(c)
        r, c = stream.finish()
        got = ("".join(reasoning) + r or None, "".join(content) + c or None)
        assert got == REPLIES[text][name], size


@pytest.fixture(scope="module")
def live(tiny_model_dir):
    yield from serve_until_clean(build_app(make_engine(tiny_model_dir),
                                           reasoning_parser="deepseek_r1"))


def test_through_the_server(live):
    """A random model never closes its think block: under deepseek_r1 the whole reply is
    thinking, streamed the same; a reply held to a format is not split."""
    kw = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=12,
              temperature=0, extra_body={"ignore_eos": True, "return_token_ids": True})
    with openai_client(live) as client:
        whole = client.chat.completions.create(**kw).choices[0]
        text = live.engine.tokenizer.decode(whole.model_extra["token_ids"])
        assert whole.message.content is None
        assert whole.message.model_extra["reasoning_content"] == text
        chunks = list(client.chat.completions.create(stream=True, **kw))
        streamed = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or ""
                           for c in chunks if c.choices)
        assert streamed == text
        held = client.chat.completions.create(**{**kw, "extra_body": {"guided_choice": ["ok"]}})
        assert held.choices[0].message.content == "ok"
        assert "reasoning_content" not in held.choices[0].message.model_extra
