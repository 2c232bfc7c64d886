"""The typed step plan the scheduler hands to an executor (model runner or simulator).

It carries ids and integers only. Block ids go as diffs: a request's newly allocated blocks
per layer group, or its whole table again when `reset_blocks` is set (first schedule,
resumption after preemption or swap-in), so the runner's persistent block tables stay in
sync without resending every table every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import TYPE_CHECKING, ClassVar, TypeVar

from kvtier.core.items import PlanItem
from kvtier.sampling_params import SamplingParams

if TYPE_CHECKING:
    import numpy as np

# A decode's input token that the step before it sampled but has not handed back yet (async
# scheduling): the runner puts the sampled token in its place on the device.
PLACEHOLDER_TOKEN = -1

_Item = TypeVar("_Item", bound=PlanItem)


@dataclass(slots=True)  # not frozen: built for every running request every step, keep it cheap
class ScheduledRequest:
    request_id: str
    token_ids: list[int]  # the tokens to compute this step
    start_pos: int  # position of token_ids[0] == num_computed_tokens before this step
    new_block_ids: tuple[tuple[int, ...], ...]  # per layer group
    reset_blocks: bool  # True: new_block_ids is the whole table
    sample: bool  # this step reaches num_tokens: sample the next token
    sampling_params: SamplingParams
    num_output_tokens: int  # before this step (min_tokens, seeded sampling offsets)
    # Penalized sampling only (SamplingParams.penalized): the request's prompt and output
    # token lists, live, from which the runner builds its counts when it has none (under
    # async scheduling the output list may lack the token in flight; the counts have it).
    history: tuple[list[int], list[int]] | None = None
    # Prompt logprobs only (SamplingParams.prompt_logprobs), on the prompt's chunks: the
    # whole prompt (a chunk's last row scores the next chunk's first token).
    prompt_ids: list[int] | None = None
    # Structured outputs only, on a sampling row: the tokens the request's grammar allows
    # next, one bit a vocabulary entry (int32 words, token t at bit t % 32 of word t // 32;
    # the engine fills it, kvtier/structured/requests.py). min_tokens' bans are in it.
    token_mask: np.ndarray | None = None
    # bad_words only, on a sampling row: the ids its output so far may not be followed by
    # (the engine fills them, kvtier/engine/token_options.py).
    banned_ids: tuple[int, ...] = ()

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def seq_len(self) -> int:
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class BlockCopy:
    """Move one block between pools; the runner does all swap-outs, then all swap-ins (a
    block freed by a swap-out may be the target of a swap-in). `group` is the block's layer
    group: with layer-level overlap the swap-ins go group by group and the forward's layers
    of group g wait only for the copies of groups <= g (kvtier/runner/swap_copies.py)."""

    src: int
    dst: int
    group: int = 0


# ---- items of the shared placement mechanisms (the runner carries them out itself) --------
@dataclass(frozen=True, slots=True)
class RecomputePrefix(PlanItem):
    """Placement.DROPPED: the KV of the request's positions [0, len(token_ids)) was dropped;
    the runner recomputes it this step (through every layer, not stored) for this step's
    attention. `host_blocks`, per layer group, the host blocks that hold the prefix's KV of
    the groups that copy it in instead (empty for the groups that recompute it); () when
    every group recomputes."""

    kind: ClassVar[str] = "recompute_prefix"
    request_id: str
    token_ids: list[int]
    host_blocks: tuple[tuple[int, ...], ...] = ()

    @property
    def count(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True, slots=True)
class HiddenBlocks(PlanItem):
    """Placement.HIDDEN's store: hidden-state blocks the request got this step (all of them
    when `reset`): the runner keeps every computed token's hidden states in them. The first
    holds token block `first_block` (the ones before it are a prefix cache hit's)."""

    kind: ClassVar[str] = "hidden_blocks"
    request_id: str
    block_ids: tuple[int, ...]
    reset: bool
    first_block: int = 0


@dataclass(frozen=True, slots=True)
class HiddenRestore(PlanItem):
    """Rebuild the KV of `num_tokens` of a request's tokens, from `first_token` on, from its
    hidden states (one K/V projection per layer) into its device blocks, before this step's
    forward."""

    kind: ClassVar[str] = "hidden_restore"
    request_id: str
    num_tokens: int
    first_token: int = 0

    @property
    def count(self) -> int:
        return self.num_tokens


def items_of(plan: StepPlan, cls: type[_Item]) -> list[_Item]:
    """The plan's items of one class, in plan order (none: an empty list, no scan)."""
    if not plan.items:
        return []
    return [i for i in plan.items if type(i) is cls]


_token_ids = attrgetter("token_ids")


@dataclass(frozen=True)
class StepPlan:
    scheduled: list[ScheduledRequest]  # requests with one query token first (decodes)
    swap_out: list[BlockCopy] = field(default_factory=list)  # device -> host
    swap_in: list[BlockCopy] = field(default_factory=list)  # host -> device
    finished_ids: list[str] = field(default_factory=list)  # since the previous plan
    preempted_ids: list[str] = field(default_factory=list)  # runner forgets their tables
    # Memory systems' own work this step (kvtier/core/items.py): empty unless one made some.
    items: list[PlanItem] = field(default_factory=list)

    @property
    def num_scheduled_tokens(self) -> int:
        return sum(map(len, map(_token_ids, self.scheduled)))  # no Python frame per request

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_out and not self.swap_in and not self.items


@dataclass(frozen=True)
class StepResult:
    """What an executor returns: the sampled token (and its logprobs) per sampling request."""

    sampled: dict[str, int]
    logprobs: dict[str, dict[int, float]] = field(default_factory=dict)
    # Requests asking for prompt logprobs: (prompt position, {token: logprob}) of the prompt
    # tokens this step scored (kvtier/runner/prompt_logprobs.py).
    prompt_logprobs: dict[str, list[tuple[int, dict[int, float]]]] = field(default_factory=dict)
