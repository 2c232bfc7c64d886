"""Conversation records as the ShareGPT-style dumps in circulation spell them, read one way.

The V3 split (what vLLM's benchmark reads) keeps `conversations: [{"from": "human" | "gpt",
"value": ...}]`; other dumps and converted datasets use `messages` or `conversation`,
`role` / `content` (OpenAI's chat format), and `user` / `assistant` (or `chatgpt`, `bard`,
`bing`) for the two sides. Each record becomes its list of (role, text) turns with the roles
mapped to HUMAN and ASSISTANT. OpenAI's content may be a list of parts: text-only parts are
the text they join into. Anything that is not a conversation (a number, a record without
turns, a turn whose text is neither, such as parts with an image) gives turns that no
human -> assistant exchange can be read from, so it is skipped, not an error.
"""

from __future__ import annotations

from typing import Any

HUMAN, ASSISTANT = "human", "gpt"
_ROLES = {"human": HUMAN, "user": HUMAN,
          "gpt": ASSISTANT, "assistant": ASSISTANT, "chatgpt": ASSISTANT, "bard": ASSISTANT,
          "bing": ASSISTANT, "model": ASSISTANT}
TURN_KEYS = ("conversations", "conversation", "messages")

Turn = tuple[str, str]  # (role, text)


def record_turns(record: Any) -> list[Turn]:
    """The record's turns, roles normalised (`normalize_turns`)."""
    if not isinstance(record, dict):
        return []
    return normalize_turns(next((record[k] for k in TURN_KEYS
                                 if isinstance(record.get(k), list)), []))


def normalize_turns(raw: list[Any]) -> list[Turn]:
    """(role, text) of each turn; a turn that cannot be read ends the list (what follows it
    would not answer what came before)."""
    turns: list[Turn] = []
    for t in raw:
        if not isinstance(t, dict):
            break
        role = t.get("from", t.get("role"))
        text = _text(t.get("value", t.get("content")))
        if not isinstance(role, str) or text is None:
            break
        turns.append((_ROLES.get(role.lower(), role.lower()), text))
    return turns


def _text(content: Any) -> str | None:
    """A turn's text: a string, or OpenAI's list of text parts joined by newlines (as chat
    templates join them); None for anything else, an image part among them: a text-only
    reading of a multimodal turn would measure a different prompt."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(
            isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
            for p in content):
        return "\n".join(p["text"] for p in content)
    return None
