"""Multi-turn conversations from ShareGPT: every turn a request, each prompt the whole
conversation so far.

Turn k's prompt = every earlier human message and assistant reply, then human message k,
then the assistant's header; its output length = the token count of the recorded reply k.
Turn k+1 follows turn k (closed loop): it is sent a think time after turn k ended.

Rendering: plain concatenated tokens, each message tokenized on its own behind a role line
(`USER: ` / `ASSISTANT:`), not the model's chat template. Tokenized apart, turn k's prompt is
a token-exact prefix of turn k+1's (BPE over the joined text could merge across a message
boundary differently from one turn to the next, and a template is not guaranteed to
render a conversation's head the same with and without its tail). The history holds the
recorded replies, not what the engine generated: a dummy model's tokens are arbitrary, and a
real model's reply would differ from the recorded one anyway; so a turn can reuse the
previous turn's prompt (its KV), not the previous turn's generated tokens.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvtier.bench.chat_records import ASSISTANT, HUMAN, Turn, normalize_turns, record_turns
from kvtier.bench.request import BenchRequest, LengthLimits, Tokenizer

USER_HEADER = "USER: "
ASSISTANT_HEADER = "ASSISTANT:"


@dataclass(frozen=True)
class MultiTurnSpec:
    """Which conversations, how many turns of each, and the users' think time."""

    think_time_s: float = 1.0  # from a turn's end to the next turn's send, every turn alike
    min_turns: int = 2  # conversations with fewer fitting turns are skipped
    max_turns: int | None = None  # a longer conversation is cut after this many turns

    def __post_init__(self) -> None:
        if self.think_time_s < 0:
            raise ValueError(f"think_time_s must be >= 0, got {self.think_time_s}")
        if self.min_turns < 1:
            raise ValueError(f"min_turns must be >= 1, got {self.min_turns}")
        if self.max_turns is not None and self.max_turns < self.min_turns:
            raise ValueError(f"max_turns {self.max_turns} < min_turns {self.min_turns}")


Exchange = tuple[str, str]  # (human message, the assistant's reply)


def conversation_exchanges(turns: list[dict]) -> list[Exchange]:
    """The leading run of human -> assistant exchanges of a record's raw turns (any of the
    spellings `kvtier.bench.chat_records` reads)."""
    return leading_exchanges(normalize_turns(turns))


def leading_exchanges(turns: list[Turn]) -> list[Exchange]:
    """ShareGPT splits long conversations into records, some of which start with the
    assistant; leading non-human turns are skipped. The run ends at the first turn out of
    alternation (two human messages in a row, another role): what follows would not be the
    answer to what came before.
    """
    i = 0
    while i < len(turns) and turns[i][0] != HUMAN:
        i += 1
    exchanges: list[Exchange] = []
    while i + 1 < len(turns) and turns[i][0] == HUMAN and turns[i + 1][0] == ASSISTANT:
        exchanges.append((turns[i][1], turns[i + 1][1]))
        i += 2
    return exchanges


def load_conversations(records: list[dict], min_turns: int = 2) -> list[list[Exchange]]:
    """Every record's exchanges, those with at least `min_turns`."""
    convs = [leading_exchanges(record_turns(r)) for r in records]
    return [c for c in convs if len(c) >= min_turns]


def conversation_requests(exchanges: list[Exchange], tokenizer: Tokenizer, limits: LengthLimits,
                          max_turns: int | None) -> list[tuple[tuple[int, ...], int]]:
    """(prompt token ids, output length) of each turn, up to the first turn outside the
    limits (later turns hold it and more)."""
    header = tokenizer.encode(ASSISTANT_HEADER)
    history: list[int] = []
    turns: list[tuple[tuple[int, ...], int]] = []
    for human, reply in exchanges[:max_turns]:
        prompt = history + tokenizer.encode(f"{USER_HEADER}{human}\n") + header
        reply_ids = tokenizer.encode(f" {reply}\n")
        if not limits.accepts(len(prompt), len(reply_ids)):
            break
        turns.append((tuple(prompt), len(reply_ids)))
        history = prompt + reply_ids
    return turns


def sample_multiturn(conversations: list[list[Exchange]], tokenizer: Tokenizer,
                     num_requests: int, seed: int, limits: LengthLimits,
                     spec: MultiTurnSpec = MultiTurnSpec()) -> list[BenchRequest]:
    """`num_requests` turns (arrival 0) from a seeded shuffle of the conversations, one
    conversation's turns after another, each follow-up turn following the one before it;
    the last conversation is cut at `num_requests`."""
    order = list(range(len(conversations)))
    random.Random(seed).shuffle(order)
    requests: list[BenchRequest] = []
    for idx in order:
        if len(requests) == num_requests:
            return requests
        turns = conversation_requests(conversations[idx], tokenizer, limits, spec.max_turns)
        if len(turns) < spec.min_turns:
            continue
        for k, (prompt, output_len) in enumerate(turns[: num_requests - len(requests)]):
            follows = len(requests) - 1 if k else None
            requests.append(BenchRequest(prompt, output_len, follows=follows,
                                         think_s=spec.think_time_s if k else 0.0))
    if len(requests) < num_requests:
        raise ValueError(
            f"only {len(requests)} turns of {len(conversations)} ShareGPT conversations with "
            f">= {spec.min_turns} turns (--multiturn-min-turns) fit {limits}; asked for "
            f"{num_requests} (--num-prompts)")
    return requests
