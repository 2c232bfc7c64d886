"""vLLM's bad_words: tokenized once a request, turned into each sampling step's banned ids
(torch-free: the runner sets the banned logits to -inf with the min_tokens bans,
kvtier/runner/sampler.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvtier.core.plan import StepPlan
from kvtier.sampling_params import InvalidRequestError


def bad_word_sequences(tokenizer: Any, words: Sequence[str],
                       vocab_size: int | None = None) -> tuple[tuple[int, ...], ...]:
    """vLLM's tokenization of bad_words: each word without its leading spaces, and with one
    leading space where that gives as many tokens with another first one (the word after a
    space, as it mostly follows text); no special tokens. An id outside the vocabulary is
    an InvalidRequestError, as vLLM's."""
    def ids(text: str) -> tuple[int, ...]:
        return tuple(int(t) for t in tokenizer.encode(text, add_special_tokens=False))

    sequences: list[tuple[int, ...]] = []
    for word in words:
        plain, spaced = ids(word.lstrip()), ids(" " + word.lstrip())
        if plain:
            sequences.append(plain)
            if len(spaced) == len(plain) and spaced[0] != plain[0]:
                sequences.append(spaced)
    if vocab_size is not None and any(t >= vocab_size for s in sequences for t in s):
        raise InvalidRequestError(f"bad_words tokenize to ids outside the vocabulary "
                                  f"[0, {vocab_size})")
    return tuple(sequences)


class BadWords:
    """One sequence's bad words: the last token of each is banned where the output so far
    ends with the ones before it (a one-token word: always), as vLLM bans them."""

    def __init__(self, sequences: tuple[tuple[int, ...], ...], output_ids: list[int]):
        self.sequences, self._output = sequences, output_ids
        # (the tokens before the last, as the list the output's tail is compared with, the
        # last): made once, compared every sampling step.
        self._words = [(list(s[:-1]), s[-1]) for s in sequences]
        # A ban that depends on the output's last tokens needs the one in flight (async).
        self.needs_last_token = any(len(s) > 1 for s in sequences)

    def banned(self) -> tuple[int, ...]:
        out, banned = self._output, set()
        for start, last in self._words:
            k = len(start)
            if k == 0 or (len(out) >= k and out[len(out) - k:] == start):
                banned.add(last)
        return tuple(sorted(banned))


def fill_bans(plan: StepPlan, bad_words_of: Callable[[str], BadWords | None]) -> None:
    """Each sampling row's bad-word bans, on its ScheduledRequest."""
    for sr in plan.scheduled:
        if sr.sample and (words := bad_words_of(sr.request_id)) is not None:
            sr.banned_ids = words.banned()
