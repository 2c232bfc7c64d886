"""A chat choice's reply as the client gets it: the thinking apart (`--reasoning-parser`,
kvtier/server/reasoning.py), then the tool calls read from the answer (kvtier/server/
tool_calls.py), whole or as it streams. A reply held to a format (structured outputs, a
named or required tool choice) has no think block: it is not split."""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.sampling_params import SamplingParams
from kvtier.server.api_models import DeltaToolCall
from kvtier.server.reasoning import ReasoningParser
from kvtier.server.tool_calls import ReplyStream, ToolPlan, read_reply
from kvtier.server.tool_parsers import ParsedCall


@dataclass(frozen=True)
class ReplyRules:
    tools: ToolPlan
    reasoning: ReasoningParser | None = None

    @classmethod
    def of(cls, tools: ToolPlan, reasoning: ReasoningParser | None,
           params: SamplingParams) -> ReplyRules:
        return cls(tools, None if params.structured_outputs is not None else reasoning)


def whole_reply(rules: ReplyRules, text: str, finish_reason: str | None
                ) -> tuple[str | None, str | None, list[ParsedCall], str | None]:
    """(reasoning, content, calls, finish_reason) of a finished choice."""
    reasoning, content = (None, text) if rules.reasoning is None else rules.reasoning.parse(text)
    if not rules.tools.reads_calls:
        return reasoning, content, [], finish_reason
    content, calls, finish_reason = read_reply(rules.tools, content or "", finish_reason)
    return reasoning, content, calls, finish_reason


class StreamedReply:
    """One choice's updates: (reasoning, content, tool-call deltas, finish_reason) each."""

    def __init__(self, rules: ReplyRules):
        self._think = rules.reasoning.stream() if rules.reasoning is not None else None
        self._tools = ReplyStream(rules.tools) if rules.tools.reads_calls else None

    def feed(self, text: str, finish_reason: str | None
             ) -> tuple[str | None, str | None, list[DeltaToolCall], str | None]:
        reasoning = ""
        if self._think is not None:
            reasoning, text = self._think.feed(text)
            if finish_reason is not None:
                rest_reasoning, rest = self._think.finish()
                reasoning, text = reasoning + rest_reasoning, text + rest
        if self._tools is None:
            content = text if self._think is None else text or None
            return reasoning or None, content, [], finish_reason
        content, calls, finish_reason = self._tools.feed(text, finish_reason)
        return reasoning or None, content, calls, finish_reason
