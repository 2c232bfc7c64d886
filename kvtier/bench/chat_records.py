"""Conversation records as the ShareGPT-style dumps in circulation spell them, read one way.

The V3 split (what vLLM's benchmark reads) keeps `conversations: [{"from": "human" | "gpt",
"value": ...}]`; other dumps and converted datasets use `messages` or `conversation`,
`role` / `content` (OpenAI's chat format), and `user` / `assistant` (or `chatgpt`, `bard`,
`bing`) for the two sides. Each record becomes its list of (role, text) turns with the roles
mapped to HUMAN and ASSISTANT; anything that is not a conversation (a number, a record
without turns, a turn whose text is not a string such as a list of multimodal parts) gives
turns that no human -> assistant exchange can be read from, so it is skipped, not an error.
"""

from __future__ import annotations

from typing import Any

HUMAN, ASSISTANT = "human", "gpt"
_ROLES = {"human": HUMAN, "user": HUMAN,
          "gpt": ASSISTANT, "assistant": ASSISTANT, "chatgpt": ASSISTANT, "bard": ASSISTANT,
          "bing": ASSISTANT, "model": ASSISTANT}
_TURN_KEYS = ("conversations", "conversation", "messages")

Turn = tuple[str, str]  # (role, text)


def record_turns(record: Any) -> list[Turn]:
    """The record's turns, roles normalised (`normalize_turns`)."""
    if not isinstance(record, dict):
        return []
    return normalize_turns(next((record[k] for k in _TURN_KEYS
                                 if isinstance(record.get(k), list)), []))


def normalize_turns(raw: list[Any]) -> list[Turn]:
    """(role, text) of each turn; a turn that cannot be read ends the list (what follows it
    would not answer what came before)."""
    turns: list[Turn] = []
    for t in raw:
        if not isinstance(t, dict):
            break
        role = t.get("from", t.get("role"))
        text = t.get("value", t.get("content"))
        if not isinstance(role, str) or not isinstance(text, str):
            break
        turns.append((_ROLES.get(role.lower(), role.lower()), text))
    return turns
