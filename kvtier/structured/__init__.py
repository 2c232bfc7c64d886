"""Structured outputs (vLLM's `structured_outputs`, OpenAI's `response_format`): a request's
tokens held to a JSON schema, a regular expression, a list of choices or an EBNF grammar.

    params.py   what a request asks for (torch-free, validated with the other sampling params)
    backend.py  the grammar engine (xgrammar, vLLM's default): compiled grammars, matchers
    requests.py the engine's side: one matcher per sequence, each step's allowed-token masks
    mask.py     the sampler's side: a packed mask applied to a row of logits (torch)

A step's mask is built on the host from the matcher after the sequence's last token and
travels with the plan (`ScheduledRequest.token_mask`, one bit a vocabulary entry); the
sampler sets the logits of the tokens it does not allow to -inf before anything else.
"""

from kvtier.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
