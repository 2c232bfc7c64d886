"""The engine: requests in, one step at a time, outputs out.

    step():  plan = scheduler.schedule()  ->  result = executor.execute(plan)
             ->  outputs = self.make_outputs(scheduler.update(plan, result))

With async scheduling (an executor that can `launch` a step without waiting for its
tokens) a step is one ahead: schedule and launch step N+1, then wait for step N's tokens
and hand out its outputs, so the host work of each step runs while the GPU computes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from kvtier.config import ConfigError, EngineConfig
from kvtier.core.executor import Executor, PendingResult
from kvtier.core.plan import StepPlan, StepResult
from kvtier.core.request import Request, RequestStatus
from kvtier.engine.args import EngineArgs
from kvtier.engine.assembly import EngineParts, assemble, freeze_startup_objects
from kvtier.engine.detokenizer import IncrementalDetokenizer
from kvtier.engine.outputs import EngineStats, RequestMetrics, RequestOutput
from kvtier.engine.request_checks import check_request
from kvtier.engine.sequences import RequestGroup, SequenceState, completion_output
from kvtier.engine.token_options import BadWords, bad_word_sequences, fill_bans
from kvtier.kv.manager import KVCacheManager
from kvtier.kv.prefix_cache import PrefixCacheBusyError, PrefixCacheStats
from kvtier.offload.install import enable_host_tier
from kvtier.offload.metrics import host_tier_metrics
from kvtier.policies import get_policy
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.scheduler.scheduler import Scheduler
from kvtier.structured.requests import SequenceGrammar, StructuredRequests, waits_on
from kvtier.tokenizer import Tokenizer

logger = logging.getLogger(__name__)


class LLMEngine:
    def __init__(self, config: EngineConfig, executor: Executor, tokenizer: Tokenizer, kv: KVCacheManager,
                 block_bytes: int, clock: Callable[[], float] = time.monotonic):
        """`clock` stamps arrivals and tokens: wall time for a real runner, the virtual time
        of a simulated executor (which then shares the scheduler and KV manager unchanged)."""
        # Async only where the executor can launch without waiting (the model runner; the
        # simulator steps synchronously), by default where it says so.
        wanted = config.scheduler.async_scheduling
        if wanted is None:
            wanted = executor.async_by_default
        self._async = bool(wanted) and executor.supports_async
        config = config.with_(scheduler=replace(config.scheduler, async_scheduling=self._async))
        self.config = config
        self.clock = clock
        self.model_config = config.model_config
        self.executor: Executor = executor
        self.tokenizer = tokenizer
        self.block_bytes = block_bytes
        self.scheduler = Scheduler(config.scheduler, kv,
                                   get_policy(config.kv_policy, config.policy_options))
        self._inflight: tuple[StepPlan, PendingResult] | None = None  # async: launched, not yet read
        self._inflight_ids: set[str] | None = None  # its request ids, built when first asked
        self._parents: dict[str, RequestGroup] = {}
        self._child_of: dict[str, tuple[RequestGroup, SequenceState]] = {}
        self._bad_words: dict[str, BadWords] = {}  # the live sequences that have some
        self._unscheduled: dict[str, RequestGroup] = {}  # added, not yet scheduled
        # Structured outputs' grammars (the server compiles a request's ahead, off this thread)
        self.grammars = StructuredRequests(tokenizer, self.model_config.vocab_size)
        self._last_step_tokens = 0
        self._last_step_reqs = 0
        self._last_step_time = 0.0

    @classmethod
    def from_engine_args(cls, args: EngineArgs) -> LLMEngine:
        """The real engine: the one assembly over the model runner."""
        from kvtier.engine.runner_factory import RunnerFactory

        if args.tensor_parallel_size > 1:  # one process per rank (kvtier/distributed/)
            from kvtier.distributed.launch import assemble_tp

            if args.host_tier.enabled:
                raise ConfigError("the host tier (--kv-offloading-size) does not run with "
                                  "--tensor-parallel-size > 1 yet")
            engine = cls.from_parts(assemble_tp(args))
        else:
            engine = cls.from_parts(assemble(args, RunnerFactory(args.device, args.dtype)))
        if args.host_tier.enabled:
            enable_host_tier(engine, args.host_tier)
        freeze_startup_objects()
        return engine

    @classmethod
    def from_parts(cls, parts: EngineParts) -> LLMEngine:
        return cls(parts.config, parts.executor, parts.tokenizer, parts.kv, parts.block_bytes,
                   clock=parts.clock)

    @property
    def kv_manager(self) -> KVCacheManager:
        """The scheduler's KV manager (pool sizes and use, for reports and benchmarks)."""
        return self.scheduler.kv

    @property
    def served_model_name(self) -> str:
        return self.config.served_model_name or self.config.model

    # ---- requests --------------------------------------------------------------------
    def add_request(
        self,
        request_id: str,
        prompt: str | list[int],
        params: SamplingParams,
        arrival_time: float | None = None,
        priority: int = 0,
    ) -> None:
        if request_id in self._parents:
            raise ValueError(f"request id {request_id!r} is already in use")
        if self._inflight is not None and self._in_flight(request_id):
            # An aborted request's last step is still on the GPU: its token would land here.
            raise ValueError(f"request id {request_id!r} is still in flight; use a new id")
        prompt_text, prompt_ids = self._tokenize(prompt)
        max_tokens = check_request(self.config, params, len(prompt_ids), priority)
        grammar = self.grammars.compile(params)
        bad_words = bad_word_sequences(self.tokenizer, params.bad_words,
                                       self.model_config.vocab_size)
        metrics = RequestMetrics(arrival_time=arrival_time if arrival_time is not None else self.clock())
        parent = RequestGroup(request_id, prompt_text, prompt_ids, metrics,
                              final_only=params.output_kind == "final_only",
                              prompt_logprobs=None if params.prompt_logprobs is None
                              else [None] * len(prompt_ids))
        eos = () if params.ignore_eos else tuple(self.tokenizer.eos_token_ids) + tuple(
            self.model_config.eos_token_ids)
        for i in range(params.n):
            child_params = params
            if params.n > 1 and params.seed is not None:
                child_params = replace(params, seed=params.seed + i)
            if i and params.prompt_logprobs is not None:  # the first sequence scores them
                child_params = replace(child_params, prompt_logprobs=None)
            rid = request_id if params.n == 1 else f"{request_id}#{i}"
            req = Request(rid, list(prompt_ids), child_params, max_tokens, eos,
                          arrival_time=metrics.arrival_time, priority=priority)
            detok = None
            if params.detokenize:
                detok = IncrementalDetokenizer(self.tokenizer, params.stop,
                                               params.include_stop_str_in_output,
                                               params.skip_special_tokens, params.min_tokens)
            child = SequenceState(i, req, detok, [] if params.logprobs is not None else None,
                                  0.0 if params.logprobs is not None else None)
            if grammar is not None:
                child.grammar = self.grammars.sequence(grammar, child_params, eos)
            if bad_words:
                self._bad_words[rid] = BadWords(bad_words, req.output_token_ids)
            parent.children.append(child)
            self._child_of[rid] = (parent, child)
            self.scheduler.add_request(req)
        self._parents[request_id] = parent
        self._unscheduled[request_id] = parent

    def _tokenize(self, prompt: str | list[int]) -> tuple[str | None, list[int]]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("prompt is empty")
            encoded = list(self.tokenizer.encode(prompt))
            if not encoded:  # whitespace under a Whitespace pre-tokenizer, say
                raise InvalidRequestError(
                    f"prompt {prompt[:40]!r} encodes to no tokens; a prompt needs at least one")
            return prompt, encoded
        ids = list(prompt)
        if not ids:
            raise InvalidRequestError("prompt is empty")
        vocab = self.model_config.vocab_size
        if any(not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})")
        return None, ids

    def abort_request(self, request_id: str | Iterable[str]) -> None:
        ids = [request_id] if isinstance(request_id, str) else list(request_id)
        for rid in ids:
            parent = self._parents.pop(rid, None)
            self._unscheduled.pop(rid, None)
            if parent is None:
                continue
            for child in parent.children:
                self.scheduler.finish_request(child.request.request_id,
                                              RequestStatus.FINISHED_ABORTED)
                self._child_of.pop(child.request.request_id, None)
                self._bad_words.pop(child.request.request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self._parents)

    @property
    def num_unfinished_requests(self) -> int:
        return len(self._parents)

    # ---- the step --------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        t0 = self.clock()
        plan = self.scheduler.schedule()
        if self._unscheduled:
            self._stamp_first_scheduled(plan, t0)
        if self._async:
            outputs = self._step_async(plan)
        else:
            self._fill_constraints(plan)
            result: StepResult = self.executor.execute(plan)
            outputs = self.make_outputs(self.scheduler.update(plan, result), result)
        self._last_step_tokens = plan.num_scheduled_tokens
        self._last_step_reqs = len(plan.scheduled)
        self._last_step_time = self.clock() - t0
        return outputs

    def _stamp_first_scheduled(self, plan: StepPlan, now: float) -> None:
        """`first_scheduled_time` of the requests this step runs for the first time (the
        queue time is first_scheduled - arrival), in whatever order the queue admits them."""
        for sr in plan.scheduled:
            rid, pop = sr.request_id, self._unscheduled.pop
            parent = pop(rid, None) or pop(rid.rsplit("#", 1)[0], None)  # n > 1: its parent
            if parent is not None:
                parent.metrics.first_scheduled_time = now

    def _step_async(self, plan: StepPlan) -> list[RequestOutput]:
        """Launch `plan`, then read back the step launched before it (the GPU runs this
        one meanwhile) and hand out that step's outputs."""
        previous, done = self._inflight, []
        if previous is not None and waits_on(plan, previous[0], self._needs_last_token):
            done, previous = self._finish_step(*previous), None  # its masks need those tokens
        self._fill_constraints(plan)
        launched = self.executor.launch(plan)
        self._inflight = (plan, launched)
        self._inflight_ids = None
        if previous is None:
            return done
        return self._finish_step(*previous)

    def _fill_constraints(self, plan: StepPlan) -> None:
        """The sampling rows' grammar masks and bad-word bans."""
        self.grammars.fill(plan, self._grammar_of)
        if self._bad_words:
            fill_bans(plan, self._bad_words.get)

    def _grammar_of(self, request_id: str) -> SequenceGrammar | None:
        entry = self._child_of.get(request_id)
        return None if entry is None else entry[1].grammar

    def _needs_last_token(self, request_id: str) -> bool:
        """Its next mask or bans read the token the step in flight samples for it."""
        words = self._bad_words.get(request_id)
        return self._grammar_of(request_id) is not None or bool(words and words.needs_last_token)

    def _in_flight(self, request_id: str) -> bool:
        """Whether the launched step computes for this id (or its n > 1 children `id#i`):
        one set a step, built only when a request arrives while it is in flight."""
        assert self._inflight is not None
        if self._inflight_ids is None:
            ids = [sr.request_id for sr in self._inflight[0].scheduled]
            self._inflight_ids = {*ids, *(rid.rsplit("#", 1)[0] for rid in ids)}
        return request_id in self._inflight_ids

    def _finish_step(self, plan: StepPlan, launched: PendingResult) -> list[RequestOutput]:
        result: StepResult = launched.result()
        return self.make_outputs(self.scheduler.update(plan, result), result)

    def make_outputs(self, touched: list[Request], result: StepResult) -> list[RequestOutput]:
        """The outputs of the requests `scheduler.update` touched (the step's last phase)."""
        now = self.clock()
        child_of = self._child_of
        for rid, scored in result.prompt_logprobs.items():
            if rid in child_of:  # (aborted meanwhile: nobody to hand them to)
                child_of[rid][0].add_prompt_logprobs(scored)
        changed: dict[str, RequestGroup] = {}
        for req in touched:
            entry = child_of.get(req.request_id)
            if entry is None:
                continue
            parent, child = entry
            if child.index == 0:  # the parent's token times follow its first child
                m = parent.metrics
                if m.first_token_time is None:
                    m.first_token_time = now
                m.token_times.append(now)
            if (child.logprobs is not None or child.detok is not None
                    or child.grammar is not None or req.status.finished):  # else (benchmarks): nothing more to record
                self._record_token(parent, child, req, result)
            if (parent.final_only and child.finish_reason is None
                    and len(parent.children) == 1):
                continue  # nothing to hand out before it finishes
            changed[parent.request_id] = parent
        outputs = []
        for parent in changed.values():
            finished = parent.finished
            if finished:
                outputs.append(self._make_output(parent, True))
                parent.metrics.finished_time = now
                self._parents.pop(parent.request_id, None)
                for c in parent.children:
                    child_of.pop(c.request.request_id, None)
                    self._bad_words.pop(c.request.request_id, None)
            elif not parent.final_only:
                outputs.append(self._make_output(parent, False))
        return outputs

    def _record_token(self, parent: RequestGroup, child: SequenceState, req: Request,
                      result: StepResult) -> None:
        """The new token's logprobs, text and stop string, and the child's end."""
        token = req.output_token_ids[-1]
        if child.logprobs is not None:
            lp = result.logprobs.get(req.request_id, {})
            child.logprobs.append(lp)
            child.cumulative_logprob = (child.cumulative_logprob or 0.0) + lp.get(token, 0.0)
        stop_str = child.detok.add(token) if child.detok is not None else None
        if (child.grammar is not None and child.grammar.accept(token)
                and not req.status.finished):  # the grammar is done: nothing more may follow
            self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
        if stop_str is not None:
            if not req.status.finished:
                self.scheduler.finish_request(req.request_id, RequestStatus.FINISHED_STOPPED)
            elif req.status is RequestStatus.FINISHED_LENGTH:  # its last token: a stop (vLLM)
                req.status = RequestStatus.FINISHED_STOPPED
            req.stop_reason = stop_str
        if req.status.finished:
            if child.detok is not None and stop_str is None:
                child.detok.flush()
            child.finish_reason = req.status.value
            m = parent.metrics
            m.num_preemptions = max(m.num_preemptions, req.num_preemptions)

    def _make_output(self, parent: RequestGroup, finished: bool) -> RequestOutput:
        return RequestOutput(parent.request_id, parent.prompt, parent.prompt_token_ids,
                             list(map(completion_output, parent.children)), finished, parent.metrics,
                             parent.children[0].request.num_cached_tokens,
                             parent.prompt_logprobs)

    # ---- introspection ---------------------------------------------------------------
    def get_stats(self) -> EngineStats:
        s, kv, c = self.scheduler, self.scheduler.kv, self.scheduler.counters
        cache = kv.prefix_cache
        pc = cache.stats if cache is not None else PrefixCacheStats()
        gpu_cached = kv.num_gpu_blocks_cached()  # every cache above the pool (its hooks)
        return EngineStats(
            num_running=len(s.running), num_waiting=len(s.waiting), num_swapped=len(s.swapped),
            gpu_blocks_used=kv.gpu.num_used - gpu_cached, gpu_blocks_total=kv.gpu.num_blocks,
            host_blocks_used=kv.host.num_used, host_blocks_total=kv.host.num_blocks,
            num_preemptions_total=c.num_preemptions,
            num_swap_out_blocks_total=c.num_swap_out_blocks,
            num_swap_in_blocks_total=c.num_swap_in_blocks,
            num_recomputed_tokens_total=c.num_recomputed_tokens,
            num_prompt_tokens_total=c.num_prompt_tokens,
            num_generation_tokens_total=c.num_generation_tokens,
            num_scheduled_tokens=self._last_step_tokens,
            num_scheduled_requests=self._last_step_reqs,
            num_prefix_recompute_tokens_total=c.num_prefix_recompute_tokens,
            num_dropped_tokens=sum(kv.num_dropped_tokens(r) for r in s.running),
            num_restored_tokens_total=c.num_restored_tokens,
            block_bytes=self.block_bytes,
            step_time_s=self._last_step_time,
            gpu_blocks_cached=gpu_cached,
            num_prefix_cache_queries_total=pc.queries,
            num_prefix_cache_hits_total=pc.hits,
            num_prefix_cache_preempted_queries_total=pc.preempted_queries,
            num_prefix_cache_preempted_hits_total=pc.preempted_hits,
            num_prefix_cache_evicted_blocks_total=pc.evicted_blocks,
            host_tier=host_tier_metrics(kv, self.executor, s.admission_gate,
                                        self.block_bytes) if kv.prefix_cache else None,
        )

    def reset_prefix_cache(self) -> bool:
        """Drop every cached KV block (vLLM's `reset_prefix_cache`, e.g. before a weight
        update); True when done (also without a cache). False, with a warning logged and
        nothing changed, while a request holds KV blocks: kvtier/kv/prefix_cache.py says
        why a reset under running requests is refused rather than partial."""
        try:
            num_blocks = self.kv_manager.reset_prefix_cache()
        except PrefixCacheBusyError as exc:
            logger.warning("prefix cache not reset: %s", exc)
            return False
        logger.info("prefix cache reset: %d cached token blocks dropped", num_blocks)
        return True

    def close(self) -> None:
        """Abort what is left and release the executor's memory now (a benchmark building
        one engine after another must not wait for the garbage collector)."""
        self.abort_request(list(self._parents))
        if self._inflight is not None:  # its tokens land before the runner frees its memory
            self._finish_step(*self._inflight)
            self._inflight = self._inflight_ids = None
        self.executor.close()

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()
        live = {c.request.request_id for p in self._parents.values() for c in p.children
                if c.finish_reason is None}
        assert live == set(self.scheduler.requests), "engine and scheduler disagree on requests"
