"""A minimal discrete-event driver: requests join at their arrival times, the engine steps,
virtual time jumps over idle gaps (nothing sleeps), so hours of trace replay in seconds."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.sim.clock import VirtualClock

SimRequest = tuple[Sequence[int], int, float]  # (prompt token ids, output tokens, arrival s)


@dataclass(frozen=True)
class RequestTimes:
    """One request's life on the virtual clock, seconds since the run's start."""

    request_id: str
    prompt_len: int
    output_len: int  # tokens actually generated
    arrival_s: float
    first_token_s: float | None
    token_times_s: tuple[float, ...]
    finish_s: float | None
    num_preemptions: int = 0
    error: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """(finish - first token) / (outputs - 1), vLLM's definition."""
        if self.finish_s is None or self.first_token_s is None or self.output_len < 2:
            return None
        return (self.finish_s - self.first_token_s) / (self.output_len - 1)


def run_simulation(engine: LLMEngine, requests: Sequence[SimRequest],
                   ignore_eos: bool = True) -> list[RequestTimes]:
    """Play `requests` against a simulated engine; results in the order given. Each request
    gets max_tokens = its output length; with ignore_eos=False an engine built with
    `output_lens` may end some earlier, as the real model did."""
    clock = engine.clock
    if not isinstance(clock, VirtualClock):
        raise TypeError("run_simulation needs an engine built by build_sim_engine")
    order = sorted(range(len(requests)), key=lambda i: requests[i][2])
    t0 = clock.now()
    done: dict[int, RequestTimes] = {}
    k = 0
    while k < len(order) or engine.has_unfinished_requests():
        while k < len(order) and t0 + requests[order[k]][2] <= clock.now():
            _submit(engine, order[k], requests[order[k]], t0, done, ignore_eos)
            k += 1
        if engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    i = int(out.request_id)
                    done[i] = _times(out, requests[i], t0)
        elif k < len(order):
            clock.advance_to(t0 + requests[order[k]][2])
    return [done[i] for i in range(len(requests))]


def _submit(engine: LLMEngine, i: int, req: SimRequest, t0: float,
            done: dict[int, RequestTimes], ignore_eos: bool) -> None:
    prompt, output_len, arrival = req
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=ignore_eos,
                            detokenize=False)
    try:
        engine.add_request(str(i), list(prompt), params, arrival_time=t0 + arrival)
    except InvalidRequestError as e:
        done[i] = RequestTimes(str(i), len(prompt), 0, arrival, None, (), None, 0, str(e))


def _times(out, req: SimRequest, t0: float) -> RequestTimes:
    m = out.metrics
    return RequestTimes(
        request_id=out.request_id, prompt_len=len(req[0]),
        output_len=len(out.outputs[0].token_ids), arrival_s=m.arrival_time - t0,
        first_token_s=None if m.first_token_time is None else m.first_token_time - t0,
        token_times_s=tuple(t - t0 for t in m.token_times),
        finish_s=None if m.finished_time is None else m.finished_time - t0,
        num_preemptions=m.num_preemptions)
