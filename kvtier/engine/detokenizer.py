"""Incremental detokenization and stop strings.

Decoding only a small window of recent tokens keeps the cost per token constant: a BPE
token can be a fragment of a multi-byte character, so text is emitted only once the window
decodes without a trailing replacement character (the HF TextStreamer approach).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.tokenizer import Tokenizer


@dataclass
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    stop: tuple[str, ...]
    include_stop_str: bool
    skip_special_tokens: bool = True
    min_tokens: int = 0  # no stop string ends in the text of this many first tokens (vLLM)
    text: str = ""
    _prefix_offset: int = 0
    _read_offset: int = 0
    _ids: list[int] = field(default_factory=list)

    def add(self, token_id: int) -> str | None:
        """Append a token; returns the stop string it completed, or None."""
        self._ids.append(token_id)
        dec = self.tokenizer.decode
        prefix = dec(self._ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        full = dec(self._ids[self._prefix_offset :], self.skip_special_tokens)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return None  # an incomplete character: wait for the next token
        old_len = len(self.text)
        self.text += full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
        if len(self._ids) <= self.min_tokens:
            return None
        return self._check_stop(old_len)

    def flush(self) -> None:
        """At the end of a request, emit what was held back waiting for more bytes."""
        if self._read_offset == len(self._ids):
            return
        dec = self.tokenizer.decode
        prefix = dec(self._ids[self._prefix_offset : self._read_offset], self.skip_special_tokens)
        full = dec(self._ids[self._prefix_offset :], self.skip_special_tokens)
        self.text += full[len(prefix) :]
        self._read_offset = len(self._ids)

    def _check_stop(self, old_len: int) -> str | None:
        for s in self.stop:
            # Only search where the new text could complete the stop string.
            idx = self.text.find(s, max(0, old_len - len(s) + 1))
            if idx != -1:
                end = idx + len(s) if self.include_stop_str else idx
                self.text = self.text[:end]
                return s
        return None
