"""Conversations into prompt ids for `LLM.chat` (vLLM's offline chat): each conversation
through the model's chat template (the engine's `chat_template` when one was given), its
messages' content a string or OpenAI's list of text parts (joined by newlines, as vLLM
joins them); vLLM's per-call `chat_template` in place of the engine's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtier.tokenizer import check_template_kwargs, read_chat_template

Conversation = Sequence[dict[str, Any]]


ROLES = ("system", "developer", "user", "assistant", "tool")  # OpenAI's, as the server's


def conversations_of(messages: Conversation | Sequence[Conversation]) -> list[Conversation]:
    """One conversation (a list of messages) or several (a list of such lists)."""
    if not messages:
        raise ValueError("no messages")
    if isinstance(messages[0], dict):
        return [messages]  # type: ignore[list-item]
    conversations = list(messages)
    for k, conv in enumerate(conversations):
        if not conv:
            raise ValueError(f"conversation {k}: no messages")
    return conversations  # type: ignore[return-value]


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         for p in content):
        return "\n".join(str(p.get("text", "")) for p in content)  # vLLM's join
    raise ValueError(f"{where}: content must be a string or a list of text parts")


def template_messages(conversation: Conversation, index: int) -> list[dict[str, Any]]:
    """The messages as the chat template reads them (text parts joined)."""
    out = []
    for i, msg in enumerate(conversation):
        if not isinstance(msg, dict) or msg.get("role") not in ROLES:
            raise ValueError(f"conversation {index}, message {i}: a dict whose role is one "
                             f"of {', '.join(ROLES)}")
        entry = dict(msg)
        entry["content"] = _text(msg.get("content", ""), f"conversation {index}, message {i}")
        out.append(entry)
    return out


def chat_prompts(tokenizer: Any, messages: Conversation | Sequence[Conversation],
                 add_generation_prompt: bool = True, continue_final_message: bool = False,
                 tools: list[dict[str, Any]] | None = None,
                 chat_template_kwargs: dict[str, Any] | None = None,
                 chat_template: str | None = None) -> list[list[int]]:
    """The prompt ids of each conversation; `chat_template` (a file or the Jinja text) in
    place of the engine's for this call."""
    if add_generation_prompt and continue_final_message:
        raise ValueError("continue_final_message leaves the last message open: it needs "
                         "add_generation_prompt=False")
    kwargs = check_template_kwargs(chat_template_kwargs)
    template = read_chat_template(chat_template) if chat_template is not None else None
    return [tokenizer.apply_chat_template(template_messages(conv, k),
                                          add_generation_prompt=add_generation_prompt,
                                          tools=tools, template_kwargs=kwargs or None,
                                          continue_final_message=continue_final_message,
                                          chat_template=template)
            for k, conv in enumerate(conversations_of(messages))]
