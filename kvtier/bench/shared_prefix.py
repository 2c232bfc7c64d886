"""SGLang bench_serving's `generated-shared-prefix` workload, in token ids.

`num_groups` system prompts of `system_prompt_len` random tokens; each group has
`prompts_per_group` questions of `question_len` random tokens; a request's prompt is its
group's system prompt then its question, its output `output_len` tokens; the requests are
shuffled (SGLang's order). Random token ids instead of SGLang's random text, so the lengths
are exact and the system prompt is a token-exact prefix of every prompt of its group.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

from kvtier.bench.request import BenchRequest
from kvtier.bench.synthetic import random_prompt


@dataclass(frozen=True)
class SharedPrefixSpec:
    """SGLang's --gsp-* options and defaults."""

    num_groups: int = 64
    prompts_per_group: int = 16
    system_prompt_len: int = 2048
    question_len: int = 128
    output_len: int = 256

    def __post_init__(self) -> None:
        for name in ("num_groups", "prompts_per_group", "question_len", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"gsp {name} must be >= 1, got {getattr(self, name)}")
        if self.system_prompt_len < 0:
            raise ValueError(f"gsp system_prompt_len must be >= 0, got {self.system_prompt_len}")

    @property
    def num_requests(self) -> int:
        return self.num_groups * self.prompts_per_group


def generated_shared_prefix(spec: SharedPrefixSpec, vocab_size: int, seed: int
                            ) -> list[BenchRequest]:
    """`spec.num_requests` requests, arrival 0, in a seeded shuffle."""
    rng = np.random.default_rng(seed)
    systems = [random_prompt(rng, spec.system_prompt_len, vocab_size)
               for _ in range(spec.num_groups)]
    requests = [BenchRequest(system + random_prompt(rng, spec.question_len, vocab_size),
                             spec.output_len)
                for system in systems for _ in range(spec.prompts_per_group)]
    random.Random(seed).shuffle(requests)
    return requests
