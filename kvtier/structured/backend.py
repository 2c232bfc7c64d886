"""The grammar engine: xgrammar (vLLM's and SGLang's default backend), imported only when a
request asks for a format. One compiler per engine over the tokenizer's vocabulary (built at
the first such request: it reads every token's bytes); compiled grammars are cached by the
compiler, keyed by their source, so a schema many requests share is compiled once.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

import numpy as np

from kvtier.sampling_params import InvalidRequestError
from kvtier.structured.fill_choice import FillChoice
from kvtier.structured.params import StructuredOutputsParams

logger = logging.getLogger(__name__)

INSTALL_HINT = "structured outputs need the xgrammar package (pip install xgrammar)"
# Compiled grammars kept for reuse at most (least recently used first out): a server that
# sees many distinct schemas must not grow without bound (vLLM's default limit).
CACHE_LIMIT_BYTES = 512 * 2**20
# Rows from which a step's masks may be filled on several threads (fill_choice.py picks by
# their measured cost): below, the threads' hand-offs cost more than they save
# (results/gpu_path/structured_overhead_cpu_{serial,threaded}_fill.json).
BATCH_FILL_MIN_ROWS = 64


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError as exc:
        raise InvalidRequestError(f"{INSTALL_HINT}: {exc}") from None
    return xgrammar


def tokenizer_info(tokenizer: Any, vocab_size: int, xgr: Any) -> Any:
    """xgrammar's view of the vocabulary: every id below the model's `vocab_size` (ids past
    the tokenizer's are padding, never allowed), the tokenizer's end-of-sequence ids."""
    stop = list(getattr(tokenizer, "eos_token_ids", ()))
    hf = getattr(tokenizer, "hf_tokenizer", None)
    if hf is not None:
        return xgr.TokenizerInfo.from_huggingface(hf, vocab_size=vocab_size,
                                                  stop_token_ids=stop or None)
    token_bytes = getattr(tokenizer, "token_bytes", None)
    if token_bytes is None:
        raise InvalidRequestError(f"structured outputs need a tokenizer that lists its "
                                  f"tokens' bytes; {type(tokenizer).__name__} does not")
    # Special tokens as empty entries: xgrammar never lets a grammar's text match them.
    vocab = [token_bytes(i) for i in range(vocab_size)]
    return xgr.TokenizerInfo(vocab, xgr.VocabType.RAW, vocab_size=vocab_size,
                             stop_token_ids=stop or None)


def choice_grammar(choices: tuple[str, ...]) -> str:
    """EBNF whose language is exactly the choices (JSON's string escapes are EBNF's)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


class GrammarBackend:
    def __init__(self, tokenizer: Any, vocab_size: int, max_threads: int = 8):
        xgr = self._xgr = _xgrammar()
        start = time.perf_counter()
        self.vocab_size = vocab_size
        self._fill_threads = max(1, min(max_threads, os.cpu_count() or 1))
        self._batch: Any = None  # xgrammar's BatchGrammarMatcher, made at the first large batch
        self.fill_choice = FillChoice(BATCH_FILL_MIN_ROWS)
        self._compiler = xgr.GrammarCompiler(tokenizer_info(tokenizer, vocab_size, xgr),
                                             max_threads=max_threads,
                                             cache_limit_bytes=CACHE_LIMIT_BYTES)
        logger.info("structured outputs: xgrammar over %d tokens, ready in %.2f s",
                    vocab_size, time.perf_counter() - start)

    @property
    def mask_words(self) -> int:
        """32-bit words of one packed allowed-token mask."""
        return (self.vocab_size + 31) // 32

    def compile(self, spec: StructuredOutputsParams) -> Any:
        """The compiled grammar; a malformed schema, pattern or grammar is the client's
        error (InvalidRequestError, a 400), not the engine's."""
        c, kind = self._compiler, spec.kind
        try:
            if kind == "json":
                return c.compile_json_schema(spec.json, any_whitespace=not spec.disable_any_whitespace)
            if kind == "json_object":  # an object, as OpenAI's json_object (and vLLM) mean
                return c.compile_json_schema('{"type": "object"}',
                                             any_whitespace=not spec.disable_any_whitespace)
            if kind == "regex":
                return c.compile_regex(spec.regex)
            if kind == "choice":
                return c.compile_grammar(choice_grammar(spec.choice or ()))
            return c.compile_grammar(spec.grammar)
        except Exception as exc:  # xgrammar raises RuntimeError / ValueError alike
            raise InvalidRequestError(f"invalid structured_outputs {kind}: "
                                      f"{str(exc).strip()[:500]}") from None

    def fill_masks(self, matchers: list[Any], masks: np.ndarray, rows: list[int]) -> None:
        """masks[rows[i]]: what matchers[i] allows next. From BATCH_FILL_MIN_ROWS rows on the
        fills may run on xgrammar's own threads (its batch matcher; the GIL released), as
        vLLM fills large batches in parallel, where that has been the faster way here."""
        n = len(matchers)
        threaded = self.fill_choice.threaded(n)
        if threaded and self._batch is None:  # made before the clock starts: once, not a fill
            self._batch = self._xgr.BatchGrammarMatcher(max_threads=self._fill_threads)
        start = time.perf_counter()
        if threaded:
            self._batch.batch_fill_next_token_bitmask(matchers, masks, rows)
        else:
            for m, i in zip(matchers, rows):
                m.fill_next_token_bitmask(masks, i)
        self.fill_choice.record(threaded, n, time.perf_counter() - start)

    def matcher(self, compiled: Any, stop_token_ids: tuple[int, ...]) -> Any:
        """A fresh matcher at the grammar's start; the sequence ends on one of its stop ids."""
        return self._xgr.GrammarMatcher(compiled,
                                        override_stop_tokens=list(stop_token_ids) or None)
