"""Options shared by the memory systems whose running requests may keep their KV in host
memory: when requests move there and when they come back."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvtier.config import ConfigError, SystemOptions
from kvtier.policies.host_resident.step_tokens import StepLimits

if TYPE_CHECKING:
    from kvtier.policies.host_resident.balance import HostBalance


@dataclass(frozen=True)
class HostResidentOptions(SystemOptions):
    # Host-running requests come back (oldest first) while the device pool stays below this
    # fraction of its blocks (NEO's swap-in rule).
    swap_in_fraction: float = 0.95
    # A request's host room is reserved for its whole life: prompt + max_tokens, at most this.
    max_model_len: int = 0
    # The scheduler's token budget: the prefill chunks a balance rule prices beside the rows.
    max_step_tokens: int = 8192
    # The scheduler's seats (max_num_seqs): a step's rows at most, in forecasts of it.
    max_step_seqs: int = 256
    # Moves take only the blocks the device is short of, the oldest of each mover, rather
    # than the whole request (its row then attends over a host prefix and a device suffix,
    # merged by log-sum-exp; a system whose runner side merges them sets it).
    partial_moves: bool = False
    # Waiting prompts the device pool cannot take are admitted past it, room made for them by
    # moving the newest device decodes to the host (NEO's CPU prefills; admission.py). Off by
    # default: the simulator finds it a loss where the GPU is fast (docs/HOST_RESIDENT_KV.md).
    host_admission: bool = False
    # The scheduler's enable_chunked_prefill: without it a prompt is admitted whole or not.
    chunked_prefill: bool = True
    # The scheduler's long-prefill controls (its effective threshold, 0: none), as forecasts
    # of a step cap its prefill chunks.
    long_prefill_threshold: int = 0
    max_partial_prefills: int = 1
    # The system's priced limit on the moves (balance.py), set once a cost model is built.
    balance_rule: HostBalance | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not 0.0 < self.swap_in_fraction <= 1.0:
            raise ConfigError(f"swap_in_fraction must be in (0, 1], got {self.swap_in_fraction}")
        if self.max_model_len < 0:
            raise ConfigError(f"max_model_len must be >= 0, got {self.max_model_len}")

    @property
    def step_limits(self) -> StepLimits:
        return StepLimits(self.max_step_tokens, self.long_prefill_threshold,
                          self.max_partial_prefills, self.chunked_prefill)
