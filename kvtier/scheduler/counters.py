"""What the scheduler has done since the engine started (the engine's stats read them)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SchedulerCounters:
    num_preemptions: int = 0
    num_swap_out_blocks: int = 0
    num_swap_in_blocks: int = 0
    num_recomputed_tokens: int = 0  # KV dropped by preemption, to be computed again
    num_prompt_tokens: int = 0
    num_generation_tokens: int = 0
    num_prefix_recompute_tokens: int = 0  # dropped-prefix tokens recomputed, all steps
    num_restored_tokens: int = 0  # tokens whose KV was rebuilt from hidden states
