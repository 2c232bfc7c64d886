"""What of a step plan decides its time: counts only, small enough to log for every step.

Decode rows (one new token) are summarised by their count and summed context, since the
decode kernel's time follows the KV bytes it reads; prefill rows keep (new tokens, start)
each, since causal attention grows with the square of a chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.core.items import item_counts
from kvtier.core.plan import HiddenBlocks, HiddenRestore, RecomputePrefix, StepPlan, items_of

# Items the shape counts in fields of its own; the others are priced by their kind's hook.
_SHAPED = (RecomputePrefix, HiddenBlocks, HiddenRestore)


@dataclass(frozen=True)
class StepShape:
    num_decodes: int = 0
    decode_ctx_sum: int = 0  # sum of the decode rows' contexts after the step (seq_len)
    decode_ctx_max: int = 0
    prefills: tuple[tuple[int, int], ...] = ()  # (new tokens, start position) per row
    num_sampled: int = 0
    num_swap_out: int = 0  # blocks device -> host
    num_swap_in: int = 0  # blocks host -> device
    num_restored_tokens: int = 0  # KV re-projected from hidden states before the step
    num_captured_tokens: int = 0  # tokens whose hidden states go to the host
    # Offloaded dropped prefixes: the prefix rows (the last `num_prefix_rows` prefills) stop
    # below the top `prefix_host_groups` layer groups, whose prefix KV comes in as
    # `num_prefix_copy_blocks` host -> device block copies overlapping the forward.
    num_prefix_rows: int = 0
    prefix_host_groups: int = 0
    num_prefix_copy_blocks: int = 0
    # Memory systems' plan items: (kind, summed count) per kind (kvtier/core/items.py),
    # priced by the hooks the systems registered. Not kept in step records' JSON.
    items: tuple[tuple[str, int], ...] = ()

    @classmethod
    def from_plan(cls, plan: StepPlan, captures_hidden: bool = False) -> StepShape:
        n_dec = ctx_sum = ctx_max = n_sampled = 0
        prefills = []
        for sr in plan.scheduled:
            n = len(sr.token_ids)
            if n == 1:
                n_dec += 1
                seq = sr.start_pos + 1
                ctx_sum += seq
                ctx_max = max(ctx_max, seq)
            else:
                prefills.append((n, sr.start_pos))
            n_sampled += sr.sample
        # Dropped prefixes: the runner recomputes each as one more prefill row.
        prefixes = items_of(plan, RecomputePrefix)
        if len(prefixes) > 1:  # in the order of their requests' rows, as the runner's batch
            index = {sr.request_id: i for i, sr in enumerate(plan.scheduled)}
            prefixes.sort(key=lambda p: index[p.request_id])
        prefix_rows = [(len(p.token_ids), 0) for p in prefixes]
        host_groups = copy_blocks = 0
        for p in prefixes:
            if p.host_blocks:
                host = [b for b in p.host_blocks if b]
                host_groups = len(host)
                copy_blocks += sum(map(len, host))
        restored = sum(r.num_tokens for r in items_of(plan, HiddenRestore))
        captured = sum(len(sr.token_ids) for sr in plan.scheduled) if captures_hidden else 0
        others = [i for i in plan.items if type(i) not in _SHAPED] if plan.items else ()
        return cls(n_dec, ctx_sum, ctx_max, tuple(prefills + prefix_rows), n_sampled,
                   len(plan.swap_out), len(plan.swap_in), restored, captured,
                   len(prefix_rows) if host_groups else 0, host_groups, copy_blocks,
                   item_counts(others) if others else ())

    def without_prefix_rows(self) -> StepShape:
        """The batch above an offloaded prefix's last recomputed layer."""
        k = self.num_prefix_rows
        return StepShape(self.num_decodes, self.decode_ctx_sum, self.decode_ctx_max,
                         self.prefills[: len(self.prefills) - k], self.num_sampled)

    @property
    def num_reqs(self) -> int:
        return self.num_decodes + len(self.prefills)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for n, _ in self.prefills)

    @property
    def num_tokens(self) -> int:
        return self.num_decodes + self.num_prefill_tokens

    @property
    def max_seq_len(self) -> int:
        """What the runner passes the decode kernel to choose its splits (eager path)."""
        return max([self.decode_ctx_max, *(n + s for n, s in self.prefills)])

    @property
    def is_decode_only(self) -> bool:
        return not self.prefills and self.num_decodes > 0

    @property
    def kind(self) -> str:
        if not self.num_reqs:
            return "copy_only" if self.num_swap_in or self.num_swap_out or self.items else "empty"
        if not self.prefills:
            return "decode"
        return "mixed" if self.num_decodes else "prefill"

    def to_json(self) -> list:
        row = [self.num_decodes, self.decode_ctx_sum, self.decode_ctx_max,
               [list(p) for p in self.prefills], self.num_sampled, self.num_swap_out,
               self.num_swap_in, self.num_restored_tokens, self.num_captured_tokens]
        if self.num_prefix_rows:
            row += [self.num_prefix_rows, self.prefix_host_groups, self.num_prefix_copy_blocks]
        return row

    @classmethod
    def from_json(cls, row: list) -> StepShape:
        d, cs, cm, pre, s, so, si, *hidden = row  # logs from before hidden states have 7 fields
        return cls(d, cs, cm, tuple((int(a), int(b)) for a, b in pre), s, so, si, *hidden)
