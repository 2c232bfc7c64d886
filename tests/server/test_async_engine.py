"""AsyncEngine without HTTP: all-or-none submission, deltas, abort, shutdown."""

from __future__ import annotations

import asyncio

import pytest

from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.server.async_engine import AsyncEngine, ServerOverloadedError, ShuttingDownError

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def run(engine, scenario):
    async def main():
        ae = AsyncEngine(engine, max_waiting_requests=4)
        ae.start()
        try:
            return await scenario(ae)
        finally:
            await ae.shutdown(timeout_s=0.0)

    return asyncio.run(main())


def test_deltas_add_up_to_the_final_text(engine):
    async def scenario(ae):
        stream = await ae.submit([("a-0", [5, 6, 7, 8]), ("a-1", [9, 10])], GREEDY)
        texts, tokens, finals = {}, {}, {}
        async for update in stream:
            for d in update.seqs:
                texts[update.request_id] = texts.get(update.request_id, "") + d.text
                tokens[update.request_id] = tokens.get(update.request_id, ()) + d.token_ids
                if d.finished:
                    finals[update.request_id] = d.final_text
        return texts, tokens, finals, await ae.call(lambda e: e.has_unfinished_requests())

    texts, tokens, finals, busy = run(engine, scenario)
    assert texts == finals and set(texts) == {"a-0", "a-1"}
    assert all(len(t) == 12 for t in tokens.values())
    assert not busy


def test_invalid_request_rolls_back_the_whole_batch(engine):
    too_long = [5] * engine.config.scheduler.max_model_len

    async def scenario(ae):
        with pytest.raises(InvalidRequestError):
            await ae.submit([("b-0", [5, 6]), ("b-1", too_long)], GREEDY)
        return ae.num_pending, await ae.call(lambda e: (e.has_unfinished_requests(), e.get_stats()))

    pending, (busy, stats) = run(engine, scenario)
    assert pending == 0 and not busy and stats.gpu_blocks_used == 0


def test_overload_and_shutdown(engine):
    long = SamplingParams(temperature=0.0, max_tokens=200, ignore_eos=True)

    async def scenario(ae):
        with pytest.raises(ServerOverloadedError):  # five new waiting requests > 4
            await ae.submit([(f"c-{i}", [5, 6, 7]) for i in range(5)], long)
        streams = [await ae.submit([(f"c-{i}", [5, 6, 7])], long) for i in range(4)]
        await ae.shutdown(timeout_s=0.0)
        with pytest.raises(ShuttingDownError):
            await ae.submit([("c-5", [5])], long)
        with pytest.raises(ShuttingDownError):
            async for _ in streams[0]:
                pass

    run(engine, scenario)
    assert not engine.has_unfinished_requests()
    assert engine.get_stats().gpu_blocks_used == 0
    engine.check_integrity()


def test_published_waiting_counts_the_backlog_too(engine):
    """Prompts held in the backlog (the engine's feed window full) wait as much as the
    engine's own waiting ones: /metrics and the stats line count them, as vLLM counts every
    waiting request; the feed window still reads the engine's own count."""
    ae = AsyncEngine(engine, max_waiting_requests=8, feed_window=2)  # not started: no worker
    ae._backlog.add([(f"w-{i}", [5, 6, 7]) for i in range(3)], GREEDY, None)
    ae._publish_stats()
    assert ae.stats.num_waiting == engine.get_stats().num_waiting + 3
    assert ae._num_engine_waiting == engine.get_stats().num_waiting
