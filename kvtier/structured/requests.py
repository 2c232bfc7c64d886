"""The engine's side of structured outputs: one grammar matcher per sequence, advanced by
each token the sequence gets, and each step's allowed-token masks for the plan's sampling
rows (torch-free: masks are numpy words the runner uploads).

A mask needs the sequence's previous token, so under async scheduling a step whose
structured row sampled in the step still in flight waits for that step's tokens before it
launches (`waits_on`); the other steps keep their overlap.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from kvtier.core.plan import StepPlan
from kvtier.sampling_params import SamplingParams
from kvtier.structured.backend import GrammarBackend

logger = logging.getLogger(__name__)


class SequenceGrammar:
    """One sequence's matcher and the ids it may not end on before min_tokens."""

    def __init__(self, matcher: Any, params: SamplingParams, eos_token_ids: tuple[int, ...]):
        self.matcher = matcher
        self.min_tokens = params.min_tokens
        self._banned = np.asarray(sorted({*eos_token_ids, *params.stop_token_ids}), np.int64)

    def accept(self, token: int) -> bool:
        """Advance by the sequence's new token; True when the sequence must end here: the
        grammar is done (under ignore_eos the engine ends it at the grammar's end token), or
        the token is one the grammar refuses, which its mask should have made impossible:
        the sequence ends rather than run on outside its grammar."""
        if self.matcher.is_terminated():
            return True
        if not self.matcher.accept_token(token):
            logger.warning("structured output: token %d outside the grammar; sequence ended", token)
            return True
        return bool(self.matcher.is_terminated())

    def hold_ends(self, masks: np.ndarray, i: int, num_output_tokens: int) -> None:
        """Row i of `masks`, filled by the matcher: before min_tokens the end ids are taken
        out, unless the grammar allows nothing else (it must end: it wins)."""
        if num_output_tokens >= self.min_tokens or not len(self._banned):
            return
        words = masks[i].view(np.uint32)
        kept = words.copy()
        banned = self._banned[self._banned < 32 * len(words)]  # (a tokenizer id past the model's)
        np.bitwise_and.at(kept, banned >> 5, ~(np.uint32(1) << (banned & 31).astype(np.uint32)))
        if kept.any():
            words[:] = kept


class StructuredRequests:
    """The engine's grammars: compiled per request, a matcher per sequence."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        self._tokenizer, self._vocab_size = tokenizer, vocab_size
        self._backend: GrammarBackend | None = None
        self._lock = threading.Lock()  # the server's tokenizer thread compiles too

    @property
    def backend(self) -> GrammarBackend:
        if self._backend is None:  # at the first request that asks for a format
            with self._lock:
                if self._backend is None:
                    self._backend = GrammarBackend(self._tokenizer, self._vocab_size)
        return self._backend

    def compile(self, params: SamplingParams) -> Any:
        """The request's compiled grammar, None when it asks for no format (before any of
        its sequences is added: a bad schema leaves nothing behind). Thread-safe; the
        compiler caches what it compiled, so the server compiles a request's grammar on
        its tokenizer thread first and the engine's own call is a look-up."""
        spec = params.structured_outputs
        return None if spec is None else self.backend.compile(spec)

    def sequence(self, compiled: Any, params: SamplingParams,
                 eos_token_ids: tuple[int, ...]) -> SequenceGrammar:
        """`eos_token_ids`: the request's (none under ignore_eos: then the grammar ends on
        the tokenizer's own, and the engine ends the sequence there)."""
        return SequenceGrammar(self.backend.matcher(compiled, eos_token_ids), params,
                               eos_token_ids)

    def fill(self, plan: StepPlan, grammar_of: Callable[[str], SequenceGrammar | None]) -> None:
        """Each structured sampling row's mask, on its ScheduledRequest."""
        rows = [(sr, g) for sr in plan.scheduled
                if sr.sample and (g := grammar_of(sr.request_id)) is not None]
        if not rows:
            return
        masks = np.zeros((len(rows), self.backend.mask_words), dtype=np.int32)
        # A sequence ended by the token in flight: its next token is dropped, anything goes.
        ended = np.array([g.matcher.is_terminated() for _, g in rows])
        masks[ended] = -1
        live = np.flatnonzero(~ended).tolist()
        self.backend.fill_masks([rows[i][1].matcher for i in live], masks, live)
        for i in live:
            sr, grammar = rows[i]
            grammar.hold_ends(masks, i, sr.num_output_tokens)
        for i, (sr, _) in enumerate(rows):
            sr.token_mask = masks[i]


def waits_on(plan: StepPlan, inflight: StepPlan, needs_last_token: Callable[[str], bool]) -> bool:
    """Whether a row of `plan` that samples from its previous token (a grammar's mask, a
    bad word's bans) samples after a token of `inflight` not yet read."""
    rows = [sr.request_id for sr in plan.scheduled
            if sr.sample and needs_last_token(sr.request_id)]
    if not rows:
        return False
    sampling = {sr.request_id for sr in inflight.scheduled if sr.sample}
    return any(rid in sampling for rid in rows)
