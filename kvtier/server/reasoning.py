"""A reasoning model's thinking apart from its answer (vLLM's `--reasoning-parser`): the
text before `</think>` is the message's `reasoning_content`, the rest its `content`.

  * qwen3: a reply that opens with `<think>` thinks until `</think>` (or its end, if cut
    short); one that does not is all answer (Qwen3 with thinking off);
  * deepseek_r1: the template opens the think block in the prompt, so the reply thinks from
    its first token until `</think>` (a leading `<think>` is dropped); one without `</think>`
    is all thinking (cut short). Use it too for templates that open `<think>` themselves
    (Qwen3's thinking-only models).

Streaming, each piece goes to its side as it comes, a possible start of a tag held back
until it is one or is not.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.server.tool_parsers import hold_back

THINK, END = "<think>", "</think>"


@dataclass(frozen=True)
class ReasoningParser:
    name: str
    thinks_first: bool  # deepseek_r1: the reply starts inside the think block

    def parse(self, text: str) -> tuple[str | None, str | None]:
        """(reasoning, content); None for an empty side."""
        head = text.lstrip()
        if head.startswith(THINK):
            body = head[len(THINK):]
        elif self.thinks_first:
            body = text
        else:
            return None, text or None
        reasoning, _, content = body.partition(END)  # no END: all thinking (cut short)
        return reasoning or None, content or None

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self)


@dataclass
class ReasoningStream:
    parser: ReasoningParser
    pending: str = ""
    state: str = "start"  # start (the reply's head undecided), think, answer

    def feed(self, text: str) -> tuple[str, str]:
        """(reasoning, content) to send now."""
        self.pending += text
        if self.state == "start":
            head = self.pending.lstrip()
            if len(head) < len(THINK) and THINK.startswith(head):
                return "", ""  # may still open a think block
            if head.startswith(THINK):
                self.pending, self.state = head[len(THINK):], "think"
            else:
                self.state = "think" if self.parser.thinks_first else "answer"
        if self.state == "answer":
            out, self.pending = self.pending, ""
            return "", out
        at = self.pending.find(END)
        if at >= 0:
            reasoning, content = self.pending[:at], self.pending[at + len(END):]
            self.pending, self.state = "", "answer"
            return reasoning, content
        out, self.pending = hold_back(self.pending, END)
        return out, ""

    def finish(self) -> tuple[str, str]:
        rest, self.pending = self.pending, ""
        if self.state == "think" or (self.state == "start" and self.parser.thinks_first):
            return rest, ""
        return "", rest


REASONING_PARSERS = {"qwen3": ReasoningParser("qwen3", thinks_first=False),
                     "deepseek_r1": ReasoningParser("deepseek_r1", thinks_first=True)}
