"""The tool-call parsers, whole and streamed in pieces of every size."""

from __future__ import annotations

import pytest

from kvtier.server.tool_parsers import (
    HermesParser,
    Llama3JsonParser,
    ParsedCall,
    make_parser,
)

F = ParsedCall("f", '{"x": 1}')
G = ParsedCall("g", "{}")
HERMES = [
    ('Sure.<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>', "Sure.", [F]),
    ('<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>\n<tool_call>\n'
     '{"name": "g", "arguments": {}}\n</tool_call>', None, [F, G]),
    ('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>', None, [F]),  # as text
    ('<tool_call>{"name": "g", "arguments": {}}', None, [G]),  # unclosed at the end
    ("no call, only a < sign and <tool", "no call, only a < sign and <tool", []),
    ("text <tool_call>not json</tool_call> more", "text <tool_call>not json</tool_call> more", []),
    ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>', []),
]


@pytest.mark.parametrize("text,content,calls", HERMES)
def test_hermes_whole(text, content, calls):
    assert HermesParser().parse(text) == (content, calls)


@pytest.mark.parametrize("text,content,calls", HERMES)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_hermes_streamed_in_pieces(text, content, calls, size):
    stream = HermesParser().stream()
    out, got = [], []
    for i in range(0, len(text), size):
        c, k = stream.feed(text[i:i + size])
        out.append(c)
        got += k
    c, k = stream.finish()
    out.append(c)
    got += k
    assert got == calls
    streamed = "".join(out)
    if calls:  # the content around the calls, as the whole parse strips it
        assert streamed.strip() == (content or "")
    else:  # nothing held back, nothing lost
        assert streamed == text


def test_hermes_holds_back_only_what_may_open_a_block():
    stream = HermesParser().stream()
    assert stream.feed("a <tool") == ("a ", [])
    assert stream.feed("s>") == ("<tools>", [])


LLAMA = [
    ('{"name": "f", "parameters": {"x": 1}}', None, [F]),
    ('<|python_tag|>{"name": "f", "parameters": {"x": 1}}; {"name": "g", "parameters": {}}',
     None, [F, G]),
    (' \n{"name": "f", "arguments": {"x": 1}}', None, [F]),
    ("It is sunny.", "It is sunny.", []),
    ('{"name": "f", "parameters": {"x": 1}} trailing', '{"name": "f", "parameters": {"x": 1}} trailing', []),
    ('{"not": "a call"}', '{"not": "a call"}', []),
]


@pytest.mark.parametrize("text,content,calls", LLAMA)
def test_llama3_json_whole_and_streamed(text, content, calls):
    parser = Llama3JsonParser()
    assert parser.parse(text) == (content, calls)
    stream = parser.stream()
    out, got = [], []
    for ch in text:
        c, k = stream.feed(ch)
        out.append(c)
        got += k
    c, k = stream.finish()
    assert (got + k) == calls
    assert "".join(out) + c == (content or "")


def test_unknown_parser():
    with pytest.raises(ValueError, match="hermes"):
        make_parser("mistral")
