from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


class WordTokenizer:
    """One id per whitespace-separated word: lengths that can be counted by hand."""

    def encode(self, text: str) -> list[int]:
        return [sum(map(ord, w)) % 1000 + 1 for w in text.split()]


@pytest.fixture
def word_tokenizer() -> WordTokenizer:
    return WordTokenizer()


@pytest.fixture
def shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared data folder {SHARED_DATA} absent")
    return SHARED_DATA
