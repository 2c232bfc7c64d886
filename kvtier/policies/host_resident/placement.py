"""Which running requests keep their KV in the host pool (NEO's rule, shared by every
system built on the host-resident placement):

  * over the device budget (the step's decodes need more new blocks than are free above
    the watermark): the newest device-resident decodes move to the host pool (LIFO) until
    the rest fit;
  * otherwise: host-running requests come back, oldest first, while the device pool stays
    below `swap_in_fraction` of its blocks and this step's decodes keep their new blocks;
  * never both in one step.

A move takes the whole request, or, with `partial_moves` (DirectKV), only as many of its
oldest token blocks as the device is short of: its table is then a host prefix and a device
suffix, its new blocks stay on the device, and its row attends over both (merged by
log-sum-exp). A whole move is made only if the host pool holds the request's whole life
there: its blocks now plus those it will still grow into (prompt + max_tokens, at most
max_model_len), less what the requests growing on the host may still grow into; a partial
one only if the pool holds the blocks it moves, beside that growth. Otherwise the move is refused
(it stays, and the scheduler preempts as usual), so a host-running request never runs out
of host blocks mid-step. A system may limit the moves further (`mover`; NEO: its CPU side
must stay hidden under the GPU's work, kvtier/policies/neo/balance.py); a move it refuses
falls back the same way.

Host-running requests are kept first in `running`, so their decodes are the step's
leading rows (the runner's external rows) and the scheduler's victims, taken from the
end, are device-resident: preempting them frees what is short.

    running:  [ host-running decodes | device-resident requests, oldest ... newest ]
                                                                moves out from here <-

A partly moved request stays a candidate, the first: when the device is short again its
next oldest blocks move before another request's, so the host prefix grows on few rows. A
system's limit prices a part as what the row may come to hold: the shortage the batch can
still reach by its requests' last tokens (at most the row's device part), so no first part
moves that pays alone while the parts after it would not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import ClassVar

from kvtier.config import SystemOptions
from kvtier.core.items import PlanItem
from kvtier.core.plan import ScheduledRequest
from kvtier.core.request import Request
from kvtier.kv.manager import KVCacheManager, cdiv
from kvtier.policies.base import KVPolicy, Preemption, drop_kv
from kvtier.policies.host_resident.admission import admitted_prompt_blocks
from kvtier.policies.host_resident.balance import last_token
from kvtier.policies.host_resident.items import HostRows, MoveToDevice, MoveToHost, SplitRows
from kvtier.policies.host_resident.options import HostResidentOptions


class HostResidentPolicy(KVPolicy):
    """Preemption recomputes; placement moves running decodes (all layer groups): whole, or
    under `partial_moves` only their oldest token blocks."""

    options: HostResidentOptions
    rows_item: ClassVar[type[HostRows]] = HostRows  # each system's own kind
    split_item: ClassVar[type[SplitRows] | None] = None  # a system that splits rows: its kind

    def __init__(self, options: SystemOptions):
        super().__init__(options if isinstance(options, HostResidentOptions)
                         else HostResidentOptions())
        self._items: list[PlanItem] = []
        self._host_running: set[str] = set()  # the KV manager's set (seen at before_step)
        # Host tokens of the host-running requests that keep a device suffix (their new
        # tokens go there, so this step's count holds).
        self._host_prefix: dict[str, int] = {}
        self.num_moved_out = self.num_moved_in = self.num_refused = 0
        self.num_moved_for_prompts = 0  # of num_moved_out: room made for waiting prompts
        self.num_refused_by_system = 0

    def preempt(self, req: Request, kv: KVCacheManager) -> Preemption:
        return drop_kv(req, kv)

    def before_step(self, running: list[Request], kv: KVCacheManager,
                    waiting: Iterable[Request] = ()) -> None:
        self._host_running = host = kv.host_running
        short = self._blocks_short(running, kv)
        if short > 0:
            self._move_out(running, kv, short)
        else:
            self._admit_past_device(running, kv, waiting, short)
        self._host_prefix = _host_prefixes(running, kv)
        if host:  # host-running first, each part in its order
            running[:] = ([r for r in running if r.request_id in host]
                          + [r for r in running if r.request_id not in host])

    def take_items(self, scheduled: list[ScheduledRequest]) -> list[PlanItem]:
        items, self._items = self._items, []
        host = self._host_running
        if not host:
            return items
        n = 0
        host_tokens: list[int] = []
        while n < len(scheduled) and scheduled[n].request_id in host:
            sr = scheduled[n]
            assert len(sr.token_ids) == 1, f"{sr.request_id}: host-running, yet not a decode"
            ctx = sr.start_pos + 1
            host_tokens.append(min(ctx, self._host_prefix.get(sr.request_id, ctx)))
            n += 1
        if any(sr.request_id in host for sr in scheduled[n:]):
            raise RuntimeError("host-running decodes must lead the step's rows")
        if n:
            ids = tuple(sr.request_id for sr in scheduled[:n])
            items.append(self.rows_item(ids, sum(host_tokens), tuple(host_tokens)))
            split = sum(h <= sr.start_pos for h, sr in zip(host_tokens, scheduled))
            if split and self.split_item is not None:
                items.append(self.split_item(split))
        return items

    # ---- decisions -------------------------------------------------------------------
    def _admit_past_device(self, running: list[Request], kv: KVCacheManager,
                           waiting: Iterable[Request], short: int) -> None:
        """The decodes fit (`short` <= 0). Prompts the device cannot take are admitted past
        it (admission.py): the room of the running and the waiting ones, else of the running
        ones alone, is made, all of it or none; host-running requests come back only into
        what the prompts whose room is there leave (none moves in to be moved out again)."""
        held = new = 0
        if self.options.host_admission:
            opts = self.options
            held, new = admitted_prompt_blocks(running, waiting, kv, opts.step_limits.start(),
                                               opts.max_step_seqs)
        kept, every = short + held, short + held + new
        for need in (every, kept):
            if need > 0 and self._make_room_for_prompts(running, kv, need):
                return
        if kv.host_running:
            self._move_in(running, kv, max(0, -every if every <= 0 else -kept))

    def mover(self, running: list[Request], kv: KVCacheManager
              ) -> Callable[[Request, int | None, int | None], bool] | None:
        """A system's own limit on this step's moves (candidates in order, newest first,
        with the tokens each would move, None for its whole context, and those to price it
        by; True: it may move), or None: only the host room limits them."""
        rule = self.options.balance_rule
        if rule is None:
            return None
        return rule.mover(running, kv.host_running, _host_prefixes(running, kv))

    def _make_room_for_prompts(self, running: list[Request], kv: KVCacheManager,
                               short: int) -> bool:
        """Move decodes out for the prompts, all the room or none (a part would strand
        its movers on the host while the prompts still wait); True: made. A refusal here
        preempts no one (the prompts wait), so only the decodes' refusals count as refused."""
        moves, left = self._plan_moves(running, kv, short, count_refusals=False)
        if left > 0:
            return False
        self._move(moves, kv)
        self.num_moved_for_prompts += len(moves)
        return True

    def _blocks_short(self, running: list[Request], kv: KVCacheManager) -> int:
        """Device blocks this step's decodes growing on the device need beyond the free ones
        above the watermark (<= 0: they fit)."""
        slots = kv.num_slots
        need = sum(kv.num_groups for r in running
                   if _is_decode(r) and not kv.grows_on_host(r.request_id)
                   and r.num_computed_tokens + 1 > slots.get(r.request_id, 0))
        return need + kv.watermark_blocks - kv.num_available_gpu_blocks()

    def _token_blocks_to_move(self, req: Request, kv: KVCacheManager, short: int) -> int | None:
        """Token blocks (each group's) of the mover to move: None for all of them (the
        whole request), else the oldest still on the device that cover `short`."""
        if not self.options.partial_moves:
            return None
        k = cdiv(short, kv.num_groups)
        return k if k < self._device_token_blocks(req, kv) else None

    def _priced_tokens(self, req: Request, kv: KVCacheManager, k: int | None,
                       ahead: int) -> int | None:
        """The tokens a move of `k` token blocks is priced by (None: a whole move, priced
        by what it moves): at most the row's device part, at least the part."""
        if k is None:
            return None
        blocks = max(k, min(cdiv(ahead, kv.num_groups), self._device_token_blocks(req, kv)))
        return blocks * kv.block_size

    @staticmethod
    def _device_token_blocks(req: Request, kv: KVCacheManager) -> int:
        table = kv.tables[req.request_id]
        return (table.num_token_blocks - table.num_dropped_blocks
                - kv.num_host_token_blocks(req.request_id))

    def _projected_short(self, running: list[Request], kv: KVCacheManager) -> int:
        """Device blocks the running requests growing on the device will still need, to
        their last tokens, beyond the free ones above the watermark: the most the batch can
        come to be short of (requests that end early free theirs: an upper bound)."""
        need = 0
        for r in running:
            table = kv.tables.get(r.request_id)
            if not kv.grows_on_host(r.request_id):
                held = kv.num_groups * table.num_token_blocks if table is not None else 0
                need += max(0, self._life_blocks(r, kv) - held)
        return need + kv.watermark_blocks - kv.num_available_gpu_blocks()

    def _move_out(self, running: list[Request], kv: KVCacheManager, short: int) -> None:
        """As many of the moves that cover `short` as the host room and the system allow:
        what is left short, the scheduler preempts for."""
        self._move(self._plan_moves(running, kv, short, count_refusals=True)[0], kv)

    def _plan_moves(self, running: list[Request], kv: KVCacheManager, short: int,
                    count_refusals: bool) -> tuple[list[tuple[Request, int | None]], int]:
        """The moves that cover `short` device blocks, in order (each mover with its token
        blocks that move, None: all of them), and the blocks still short after them (> 0:
        the host room or the system's limit refused the next one, counted as refused if
        `count_refusals`)."""
        host = kv.host_running
        may_move = self.mover(running, kv)
        # Partly moved requests first (newest first), then the device rows (newest first):
        # a host prefix grows on the rows that have one, so few rows read the host (each
        # row's read is latency-bound when short; and a decode graph per row count).
        newest = [r for r in reversed(running) if _is_decode(r) and not kv.grows_on_host(
            r.request_id)]
        # Only a system's limit prices a part by the shortage ahead: worked out for it alone.
        ahead = (self._projected_short(running, kv)
                 if may_move is not None and self.options.partial_moves else 0)
        room = kv.host.num_free - self._host_growth(running, kv)
        moves: list[tuple[Request, int | None]] = []
        for req in sorted(newest, key=lambda r: r.request_id not in host):
            if short <= 0:
                break
            k = self._token_blocks_to_move(req, kv, short)
            held = kv.num_groups * kv.num_host_token_blocks(req.request_id)
            need = (self._life_blocks(req, kv) - held if k is None else kv.num_groups * k)
            if room < need:
                self.num_refused += count_refusals
                break  # the host pool cannot hold it (for its life)
            tokens = None if k is None else k * kv.block_size
            # A part is priced as what the row may come to hold: the batch's shortage ahead
            # (at most the row's device part), so no part moves that the next would undo.
            if may_move is not None and not may_move(req, tokens, self._priced_tokens(
                    req, kv, k, ahead)):
                self.num_refused_by_system += count_refusals
                break  # the system's own limit
            room -= need
            moved = self._device_token_blocks(req, kv) if k is None else k
            # A whole move also frees the block its decode would have taken this step.
            grows = k is None and req.num_computed_tokens + 1 > kv.num_slots.get(
                req.request_id, 0)
            short -= kv.num_groups * (moved + grows)
            moves.append((req, k))
        return moves, short

    def _move(self, moves: list[tuple[Request, int | None]], kv: KVCacheManager) -> None:
        for req, k in moves:
            copies = kv.swap_out(req, k)
            assert copies is not None, "the host room was checked"
            kv.host_running.add(req.request_id)
            self._items.append(MoveToHost(req.request_id, tuple(copies), kv.block_table(req)))
            self.num_moved_out += 1

    def _move_in(self, running: list[Request], kv: KVCacheManager, spare: int) -> None:
        """`spare`: free device blocks left once this step's decodes have their new ones
        (a request comes back only into those, so the next step is not short at once)."""
        host = kv.host_running
        ceiling = self.options.swap_in_fraction * kv.gpu.num_blocks
        for req in [r for r in running if r.request_id in host]:  # oldest first
            rid = req.request_id
            # A request growing on the device has its new blocks counted in `spare` already.
            grows = kv.grows_on_host(rid) and req.num_computed_tokens + 1 > kv.num_slots[rid]
            need = kv.num_groups * (kv.num_host_token_blocks(rid) + (1 if grows else 0))
            in_use = kv.gpu.num_used - kv.num_gpu_blocks_cached()
            if in_use + need >= ceiling or need > spare:
                return
            spare -= need
            host.discard(req.request_id)
            copies = kv.swap_in(req)
            self._items.append(MoveToDevice(req.request_id, tuple(copies), kv.block_table(req)))
            self.num_moved_in += 1

    def _life_blocks(self, req: Request, kv: KVCacheManager) -> int:
        """Blocks of every layer group the request holds at its last token."""
        end = last_token(req, self.options.max_model_len)
        return kv.num_groups * cdiv(max(end, req.num_computed_tokens + 1), kv.block_size)

    def _host_growth(self, running: list[Request], kv: KVCacheManager) -> int:
        """Host blocks the requests growing on the host may still take."""
        return sum(max(0, self._life_blocks(r, kv)
                       - kv.num_groups * kv.tables[r.request_id].num_token_blocks)
                   for r in running if kv.grows_on_host(r.request_id))


def _host_prefixes(running: list[Request], kv: KVCacheManager) -> dict[str, int]:
    """Host tokens of each host-running request that keeps a device suffix."""
    host = kv.host_running
    return {r.request_id: kv.num_host_token_blocks(r.request_id) * kv.block_size
            for r in running if r.request_id in host and not kv.grows_on_host(r.request_id)}


def _is_decode(req: Request) -> bool:
    """Its next step computes one token (async scheduling: the in-flight one)."""
    return req.num_tokens + req.num_pending_tokens - req.num_computed_tokens <= 1
