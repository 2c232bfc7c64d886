"""Continuous batching on token counts, with preemption delegated to the KV policy.

Each step, in order (vLLM V1's order):
  1. running requests, oldest first, get their next tokens (a decode: 1; a chunked prefill:
     up to the remaining budget); when blocks run out, the newest running request (under
     the priority policy, the one of the highest priority value) is preempted until the
     allocation fits (possibly the request itself);
  2. if nobody was preempted: swapped requests come back (in preemption order; under the
     priority policy by priority, then arrival) while they fit;
  3. if nobody was preempted and nothing is still swapped out: waiting requests are
     admitted in the queue's order while they fit — swapped requests arrived first (vLLM
     V0's rule; under the priority policy, waiting requests ahead of the swapped head are
     admitted before it).
A prefill's chunk (up to the remaining budget) may be capped further, and held back while
the step has its partial prefills: kvtier/scheduler/prefill_budget.py.
The result is one StepPlan of ids and counts; no tensors are touched here.

Async scheduling (SchedulerConfig.async_scheduling): `schedule()` for step N+1 runs while
step N is still on the GPU, before `update()` has its tokens. A request that samples in a
plan holds a pending token until its update; the next plan decodes it as a placeholder
(the runner substitutes the sampled token on the device), and a request whose pending token
reaches max_tokens is not scheduled again (it finishes when the token comes back). One that
stops on EOS or a stop string wastes its one speculative decode, as in vLLM.
"""

from __future__ import annotations

from collections import deque

from kvtier.config import SchedulerConfig
from kvtier.core.plan import (
    PLACEHOLDER_TOKEN,
    HiddenBlocks,
    HiddenRestore,
    RecomputePrefix,
    ScheduledRequest,
    StepPlan,
    StepResult,
)
from kvtier.core.request import Request, RequestStatus
from kvtier.kv.manager import KVCacheManager
from kvtier.policies.base import KVPolicy
from kvtier.scheduler.counters import SchedulerCounters
from kvtier.scheduler.gate import AdmissionGate
from kvtier.scheduler.prefill_budget import PrefillChunker
from kvtier.scheduler.queue import FCFSQueue, make_queue
from kvtier.scheduler.step_builder import StepBuilder


class Scheduler:
    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, policy: KVPolicy,
        waiting: FCFSQueue | None = None,
    ):
        self.config, self.kv, self.policy = config, kv, policy
        self.waiting = waiting if waiting is not None else make_queue(config.schedule_policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.requests: dict[str, Request] = {}
        self.counters = SchedulerCounters()
        self._finished_ids: list[str] = []
        self._preempted_ids: list[str] = []
        self._async = config.async_scheduling
        # Whether the waiting queue's head is admitted now, given the running requests and
        # the tokens this step computes so far (the host tier's cache-aware admission,
        # kvtier/offload/scheduling.py); None: always.
        self.admission_gate: AdmissionGate | None = None

    # ---- requests in and out -----------------------------------------------------------
    def add_request(self, req: Request) -> None:
        self.requests[req.request_id] = req
        self.waiting.add(req)

    def finish_request(self, request_id: str, status: RequestStatus) -> Request | None:
        """End a request early (abort, stop string); frees its blocks at once."""
        req = self.requests.get(request_id)
        if req is None or req.status.finished:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.SWAPPED:
            self.swapped.remove(req)
        else:
            self.waiting.remove(req)
        req.status = status
        self._release(req)
        return req

    def _release(self, req: Request) -> None:
        self.kv.free(req)
        del self.requests[req.request_id]
        self._finished_ids.append(req.request_id)

    @property
    def num_unfinished(self) -> int:
        return len(self.requests)

    # ---- one step ------------------------------------------------------------------------
    def schedule(self) -> StepPlan:
        step = StepBuilder(self.config.max_num_batched_tokens, PrefillChunker.for_step(self.config))
        self.policy.before_step(self.running, self.kv, self.waiting)
        if self.admission_gate is not None:
            self.admission_gate.begin_step()
        self._schedule_running(step)
        if not step.preempted:
            self._schedule_queued(step)
        return self._make_plan(step)

    def _schedule_queued(self, step: StepBuilder) -> None:
        """Swapped requests come back before waiting ones are admitted (vLLM V0: no new
        prefill while a swapped request waits), unless the queue's order puts waiting ones
        first (priority: those ahead of the swapped head, admitted before it)."""
        head = self.swapped[0] if self.swapped else None
        if head is not None and self.waiting and self.waiting.precedes(self.waiting.peek(), head):
            self._schedule_waiting(step, before=head)
        self._schedule_swapped(step)
        if not self.swapped:
            self._schedule_waiting(step)

    def _schedule_running(self, step: StepBuilder) -> None:
        # The hot loop of every step (one pass over up to max_num_seqs requests): locals
        # instead of attribute lookups, counts read straight off the token lists.
        kv, running = self.kv, self.running
        allocate_slots, num_slots, no_new_blocks = kv.allocate_slots, kv.num_slots, kv.no_new_blocks
        entries, budget, chunk = step.entries, step.budget, step.prefills.chunk
        i = self.policy.num_held_back(running)  # those before i sit this step out
        while i < len(running) and budget > 0:
            req = running[i]
            pending = req.num_pending_tokens  # async scheduling only
            if pending and len(req.output_token_ids) + pending >= req.max_tokens:
                i += 1  # its last token is in flight: it finishes when that comes back
                continue
            # Nothing is dropped anywhere unless the policy drops prefixes.
            recompute = kv.num_dropped_tokens(req) if kv.num_dropped_token_blocks else 0
            remaining = n = (len(req.prompt_token_ids) + len(req.output_token_ids) + pending
                             - req.num_computed_tokens)
            if n > budget - recompute:  # (min() is a call)
                n = budget - recompute
            if n <= 0:
                break  # its prefix recomputation does not fit this step's budget
            if remaining > 1:  # a prefill: its chunk may be capped, or wait a step
                n = chunk(remaining, n)
                if not n:
                    i += 1
                    continue
            blocks: tuple[tuple[int, ...], ...] | None
            if req.num_computed_tokens + n <= num_slots.get(req.request_id, 0):
                blocks = no_new_blocks  # allocate_slots' answer when the tokens fit already
            else:
                blocks = allocate_slots(req, n)
            while blocks is None:
                # A policy may free memory without preempting (by dropping KV prefixes: the
                # requests it picks pay by recomputing them, counted from their next step).
                if self.policy.make_room(running, kv, kv.blocks_needed(req, n)):
                    blocks = allocate_slots(req, n)
                    recompute = kv.num_dropped_tokens(req)  # it may have dropped more
                    continue
                j = self.waiting.victim_index(running)  # the newest, or by priority
                victim = running.pop(j)
                if j < i:  # scheduled this step already (or held back): no longer, and
                    # the blocks it got for this step hold nothing to move or keep
                    budget += step.unschedule(victim)
                    kv.release_unfilled(victim)
                    i -= 1
                self._preempt(victim, step)
                if victim is req:
                    step.prefills.give_back(n, remaining)
                    break
                blocks = allocate_slots(req, n)
            if blocks is None:
                continue  # req itself was preempted: the next runner is at i now
            entries.append((req, n, blocks, False, recompute))  # step.add, inlined
            budget -= n + recompute
            i += 1
        step.budget = budget

    def _schedule_swapped(self, step: StepBuilder) -> None:
        while self.swapped and step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.swapped[0]
            remaining = req.num_tokens - req.num_computed_tokens
            n = step.prefills.chunk(remaining, min(remaining, step.budget))
            if not n:
                break
            # The watermark protects running requests; with none running it only blocks
            # (one that needs the whole pool would never come back).
            if not self.policy.can_resume(req, self.kv, n, use_watermark=bool(self.running)):
                step.prefills.give_back(n, remaining)
                break
            work = self.policy.resume(req, self.kv)
            blocks = self.kv.allocate_slots(req, n)
            assert blocks is not None, "can_resume promised room"
            self.swapped.popleft()
            step.swap_in += work.copies
            if work.items:
                step.items += work.items
            self.counters.num_swap_in_blocks += len(work.copies)
            if work.restore_tokens:
                step.items.append(HiddenRestore(req.request_id, work.restore_tokens,
                                                work.restore_from))
                self.counters.num_restored_tokens += work.restore_tokens
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, n, self.kv.block_table(req), reset=True)

    def _schedule_waiting(self, step: StepBuilder, before: Request | None = None) -> None:
        """`before`: admit only requests the queue puts ahead of this swapped-out one."""
        gate = self.admission_gate
        if step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            self.waiting.reorder(self.kv.prefix_cache)
        while self.waiting and step.budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting.peek()
            if before is not None and not self.waiting.precedes(req, before):
                break
            if gate is not None and not gate.admit_now(
                    req, self.running, self.config.max_num_batched_tokens - step.budget):
                break  # FCFS: it waits for a prefix being computed, or for load room
            # A prefix cache may hold the KV of its first tokens: it starts after them, and
            # only the rest costs budget.
            cached = req.num_computed_tokens = self.kv.admit(req) if self.kv.hooks else 0
            remaining = req.num_tokens - req.num_computed_tokens
            if remaining > step.budget and not self.config.enable_chunked_prefill:
                self._unadmit(req, cached)
                break
            n = step.prefills.chunk(remaining, min(remaining, step.budget))
            if not n:
                self._unadmit(req, cached)
                break  # FCFS: it waits for a step with room for another partial prefill
            # The watermark protects running requests; with none running it only blocks.
            blocks = self.kv.allocate_slots(req, n, use_watermark=bool(self.running))
            if blocks is None:
                step.prefills.give_back(n, remaining)
                self._unadmit(req, cached)
                break
            if req.num_cached_tokens is None:  # its first admission (vLLM's rule)
                req.num_cached_tokens = cached
            if cached:  # cached prompt tokens are not computed: not counted as prefill
                req.num_prompt_tokens_seen = max(req.num_prompt_tokens_seen,
                                                 min(cached, req.num_prompt_tokens))
            self.waiting.pop()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            step.add(req, n, self.kv.block_table(req), reset=True)
        if gate is not None and self.waiting and before is None:  # once a step: the last pass
            gate.fill_bubbles(self.waiting, self.config.max_num_batched_tokens)

    def _unadmit(self, req: Request, cached: int) -> None:
        """It stays WAITING: give back the cached blocks its admission took."""
        if cached:
            self.kv.free(req)
            req.num_computed_tokens = 0

    def _preempt(self, req: Request, step: StepBuilder) -> None:
        result = self.policy.preempt(req, self.kv)
        req.num_preemptions += 1
        self.counters.num_preemptions += 1
        self.counters.num_recomputed_tokens += result.num_dropped_tokens
        step.preempted.append(req)
        self._preempted_ids.append(req.request_id)
        if result.items:
            step.items += result.items
        if result.resumable:
            step.swap_out += result.copies
            self.counters.num_swap_out_blocks += len(result.copies)
            self.swapped.appendleft(req)  # it ran before every other swapped request
            self.swapped = self.waiting.resume_order(self.swapped)
        else:
            self.waiting.prepend(req)

    def _count_prompt_tokens(self, req: Request, computed: int) -> None:
        """Prompt tokens computed for the first time (a re-prefill after preemption counts
        as recomputed, not here)."""
        first_time = computed - req.num_prompt_tokens_seen
        if first_time > 0:
            self.counters.num_prompt_tokens += first_time
            req.num_prompt_tokens_seen += first_time

    def _make_plan(self, step: StepBuilder) -> StepPlan:
        kv, hidden_store, items = self.kv, self.kv.hidden, step.items
        # Prefixes dropped after a request was scheduled (make_room for a later one) are
        # recomputed this step too: read them now, when anything is dropped at all.
        num_dropped_tokens = kv.num_dropped_tokens if kv.num_dropped_token_blocks else None
        # Decodes first: attention kernels split the batch at num_decodes without a sync.
        # Two lists in schedule order == a stable sort on "not a decode".
        decodes: list[ScheduledRequest] = []
        others: list[ScheduledRequest] = []
        prefix_recompute = 0
        is_async = self._async
        # Blocks this plan fills are cached now: a later plan reads them after this step
        # wrote them (kvtier/kv/prefix_cache.py's contract); at an admission, also a hit's
        # blocks this step loads (the host tier), though no block is filled.
        block_size = kv.block_size if kv.prefix_cache is not None else 0
        for req, n, blocks, reset, _ in step.entries:
            start = req.num_computed_tokens
            end = req.num_computed_tokens = start + n
            if block_size and (reset or end // block_size > start // block_size):
                kv.cache_full_blocks(req, end)
            prompt, out = req.prompt_token_ids, req.output_token_ids
            num_prompt = len(prompt)
            pending = req.num_pending_tokens
            if req.num_prompt_tokens_seen < num_prompt:  # prefills only: a call is rare
                self._count_prompt_tokens(req, min(end, num_prompt))
            params, scored = req.sampling_params, None
            if start >= num_prompt:  # decodes and chunks of generated tokens
                token_ids = out[start - num_prompt : end - num_prompt]
                if pending and len(token_ids) < n:  # the in-flight token: one decode
                    token_ids = [PLACEHOLDER_TOKEN]
            else:
                token_ids = req.token_ids_slice(start, end)
                scored = prompt if params.prompt_logprobs is not None else None
            num_known = num_prompt + len(out) + pending
            sample = end == num_known
            if sample and is_async:
                req.num_pending_tokens = pending + 1
            dropped = num_dropped_tokens(req) if num_dropped_tokens is not None else 0
            if dropped:  # Placement.DROPPED: the runner recomputes the prefix this step
                prefix_recompute += dropped
                items.append(RecomputePrefix(req.request_id, req.token_ids_slice(0, dropped),
                                             kv.prefix_host_blocks(req)
                                             if kv.prefix_host_groups else ()))
            if hidden_store is not None:  # every computed token's hidden states are kept
                rid = req.request_id  # (from its first computed token: a hit has none)
                new_hidden = hidden_store.extend(rid, end, start)
                items.append(HiddenBlocks(rid, tuple(hidden_store.ids.get(rid, ())), reset,
                                          hidden_store.first_token(rid) // kv.block_size)
                             if reset else HiddenBlocks(rid, new_hidden, reset))
            # Positional, in field order (request_id, token_ids, start_pos, new_block_ids,
            # reset_blocks, sample, sampling_params, num_output_tokens, history, prompt_ids): keywords
            # cost more, once per running request a step (bench_host_overhead_cpu.py).
            (decodes if n == 1 else others).append(ScheduledRequest(
                req.request_id, token_ids, start, blocks, reset, sample, params, len(out) + pending,
                (prompt, out) if sample and params.penalized else None, scored))
        self.counters.num_prefix_recompute_tokens += prefix_recompute
        if others:
            decodes += others
        return self._plan(step, decodes)

    def _plan(self, step: StepBuilder, scheduled: list[ScheduledRequest]) -> StepPlan:
        """The step's plan: its scheduled requests (decodes first), copies and items."""
        kv = self.kv
        if kv.pending_swap_out:  # prefixes offloaded this step: out before any swap-in
            step.swap_out = kv.take_pending_swap_out() + step.swap_out
        if kv.prefix_cache is not None and kv.prefix_cache.lower is not None:
            step.items += kv.take_cache_items()  # the host tier's stores and loads
        own = self.policy.take_items(scheduled)  # placement work outside preempt/resume
        plan = StepPlan(scheduled=scheduled, swap_out=step.swap_out, swap_in=step.swap_in,
                        finished_ids=self._finished_ids, preempted_ids=self._preempted_ids,
                        items=own + step.items if own else step.items)
        self._finished_ids, self._preempted_ids = [], []
        return plan

    # ---- results -------------------------------------------------------------------------
    def update(self, plan: StepPlan, result: StepResult) -> list[Request]:
        """Append sampled tokens; finish requests that stopped. Returns requests that
        received a token this step (finished ones included, already released)."""
        touched: list[Request] = []
        requests, sampled = self.requests, result.sampled
        any_finished = False
        for sr in plan.scheduled:
            if not sr.sample:
                continue  # a prefill chunk that samples nothing
            req = requests.get(sr.request_id)
            if req is None:
                continue  # aborted meanwhile
            if req.num_pending_tokens:
                req.num_pending_tokens -= 1
            status = req.status
            req.append_token(sampled[sr.request_id])
            touched.append(req)
            if req.status.finished:
                if status is not RequestStatus.RUNNING:
                    # Async: preempted by the plan scheduled while its token was in flight.
                    (self.waiting if status is RequestStatus.WAITING else self.swapped).remove(req)
                self._release(req)
                any_finished = True
        self.counters.num_generation_tokens += len(touched)
        if any_finished:  # one pass, not a list.remove per finished request
            self.running[:] = [r for r in self.running if not r.status.finished]
        return touched

    def check_integrity(self) -> None:
        self.kv.check_integrity()
        in_queues = [*self.waiting, *self.running, *self.swapped]
        assert len({r.request_id for r in in_queues}) == len(in_queues), "request queued twice"
        assert {r.request_id for r in in_queues} == set(self.requests), "queues != requests"
        for r in self.running:
            assert r.status is RequestStatus.RUNNING
        for r in self.swapped:
            assert r.status is RequestStatus.SWAPPED
        for r in self.waiting:
            assert r.status is RequestStatus.WAITING
            assert r.request_id not in self.kv.tables, f"{r.request_id} waits but holds blocks"
