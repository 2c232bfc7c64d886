"""SGLang's logprobs on /generate (`return_logprob`): in each sequence's `meta_info`, every
output token as `[logprob, token id, text]` and, with `top_logprobs_num` k, the k likeliest
at each position the same way (text only under `return_text_in_logprobs`, else null).
Input logprobs (`logprob_start_len` >= 0) are not served: SGLang's default, -1, asks for
none, and the lists stay empty."""

from __future__ import annotations

from typing import Any

from kvtier.server.results import ChoiceResult, clamp_logprob, top_entries

Entry = list[Any]  # [logprob, token id, text or None]


def logprob_meta(tokenizer: Any, res: ChoiceResult, k: int, with_text: bool) -> dict[str, Any]:
    def entry(token: int, value: float | None) -> Entry:
        logprob = None if value is None else clamp_logprob(value)
        return [logprob, token, tokenizer.decode([token]) if with_text else None]

    chosen = [entry(t, lps.get(t)) for t, lps in zip(res.token_ids, res.logprobs)]
    top = [[entry(t, v) for t, v in top_entries(lps, k)] for lps in res.logprobs] if k else []
    return {"input_token_logprobs": [], "input_top_logprobs": [],
            "output_token_logprobs": chosen, "output_top_logprobs": top}
