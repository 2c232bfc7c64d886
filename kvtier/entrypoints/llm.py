"""The offline API, shaped like vLLM's so users' scripts carry over:

    llm = LLM("tiny-llama", load_format="dummy", kv_policy="swap")
    outs = llm.generate(["Hello"], SamplingParams(max_tokens=32))
    outs[0].outputs[0].text
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(max_tokens=32))
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvtier.engine.args import EngineArgs
from kvtier.engine.batch_defaults import offline_batch_defaults
from kvtier.engine.llm_engine import LLMEngine
from kvtier.engine.outputs import RequestOutput
from kvtier.entrypoints.chat import Conversation, chat_prompts
from kvtier.sampling_params import SamplingParams

PromptLike = str | list[int] | dict[str, Any]


class LLM:
    def __init__(self, model: str, **options: Any):
        """`options`: EngineArgs' fields. On a large GPU the batch limits left unset are
        vLLM's offline ones (`kvtier/engine/batch_defaults.py`)."""
        # Offline, no client waits between tokens: prompts' chunks go uncapped (as vLLM's LLM).
        options = {"long_prefill_token_threshold": 0, **offline_batch_defaults(options), **options}
        if "scheduling_policy" in options:  # vLLM's name for it
            options["schedule_policy"] = options.pop("scheduling_policy")
        self.engine_args = EngineArgs(model=model, **options)
        self.engine = LLMEngine.from_engine_args(self.engine_args)
        self._ids = itertools.count()

    def get_tokenizer(self):
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What `generate` samples with when given no SamplingParams: the model's
        generation_config.json fields over SamplingParams' defaults (vLLM's)."""
        return SamplingParams(**dict(self.engine.config.generation_defaults.sampling))

    def reset_prefix_cache(self) -> bool:
        """Drop every cached KV block (vLLM's); between `generate` calls no request holds
        blocks, so it returns True unless another caller left requests in the engine."""
        return self.engine.reset_prefix_cache()

    def generate(
        self,
        prompts: PromptLike | Sequence[PromptLike],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; outputs come back in the prompts' order.
        A prompt is text, a list of token ids, or {"prompt_token_ids": [...]}/{"prompt": s},
        a dict with vLLM's "cache_salt" too (docs/PREFIX_CACHE.md).
        `priority`: one a prompt, lower first (vLLM's; needs scheduling_policy="priority")."""
        if isinstance(prompts, (str, dict)) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        ):
            prompts = [prompts]  # type: ignore[list-item]
        prompts = list(prompts)  # type: ignore[arg-type]
        params = sampling_params or self.get_default_sampling_params()
        param_list = [params] * len(prompts) if isinstance(params, SamplingParams) else list(params)
        if len(param_list) != len(prompts):
            raise ValueError("need one SamplingParams, or one per prompt")
        priorities = [0] * len(prompts) if priority is None else list(priority)
        if len(priorities) != len(prompts):
            raise ValueError("need one priority per prompt")
        ids: list[str] = []
        try:
            for prompt, p, rank in zip(prompts, param_list, priorities):
                p = replace(p, output_kind="final_only")  # generate() returns finished outputs only
                if isinstance(prompt, dict) and prompt.get("cache_salt") is not None:
                    p = replace(p, cache_salt=prompt["cache_salt"])  # vLLM's prompt dict key
                rid = str(next(self._ids))
                self.engine.add_request(rid, _unwrap(prompt), p, priority=rank)
                ids.append(rid)
        except Exception:
            self.engine.abort_request(ids)  # a bad prompt fails the call, leaving nothing queued
            raise
        return self._run(ids, use_tqdm)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = False,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """vLLM's offline chat: one conversation (a list of {"role", "content"} messages) or
        several, each through the model's chat template (or `chat_template`, a file or the
        Jinja text, for this call), then `generate`."""
        prompts = chat_prompts(self.engine.tokenizer, messages, add_generation_prompt,
                               continue_final_message, tools, chat_template_kwargs,
                               chat_template)
        return self.generate([{"prompt_token_ids": p} for p in prompts], sampling_params,
                             use_tqdm)

    def _run(self, ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        done: dict[str, RequestOutput] = {}
        bar = None
        if use_tqdm:
            from tqdm import tqdm

            bar = tqdm(total=len(ids), desc="generate")
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    done[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [done[i] for i in ids]


def _unwrap(prompt: PromptLike) -> str | list[int]:
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return list(prompt["prompt_token_ids"])
        return str(prompt["prompt"])
    return prompt
