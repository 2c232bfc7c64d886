"""200 concurrent streaming requests complete; afterwards every block is free again."""

from __future__ import annotations

import asyncio
import time

import openai
import pytest

from kvtier.policies import policy_names
from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

NUM_REQUESTS = 200
MAX_TOKENS = 8


async def _one(client: openai.AsyncOpenAI, i: int) -> tuple[str, str | None, int]:
    kwargs = dict(model=MODEL, max_tokens=MAX_TOKENS, temperature=0.8, seed=i, stream=True,
                  stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    if i % 2:
        stream = await client.chat.completions.create(
            messages=[{"role": "user", "content": f"request {i}: tell me a story"}], **kwargs)
    else:
        stream = await client.completions.create(prompt=f"request {i}: once upon a time", **kwargs)
    text, finish, completion_tokens = "", None, -1
    async for chunk in stream:
        if chunk.usage is not None:
            completion_tokens = chunk.usage.completion_tokens
        for c in chunk.choices:
            text += (c.delta.content or "") if i % 2 else c.text
            finish = c.finish_reason or finish
    return text, finish, completion_tokens


async def _run_all(base_url: str) -> list:
    async with openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0,
                                  timeout=60) as client:
        return await asyncio.gather(*(_one(client, i) for i in range(NUM_REQUESTS)))


def displaced(engine) -> int:
    """Requests that left the device pool: preempted, or moved to the host pool running."""
    return (engine.get_stats().num_preemptions_total
            + getattr(engine.scheduler.policy, "num_moved_out", 0))


@pytest.fixture(params=policy_names())
def live(request, tiny_model_dir):
    """A server per KV policy (every registered one), each on a fresh engine."""
    srv = start_server(build_app(make_engine(tiny_model_dir, kv_policy=request.param)))
    yield srv
    srv.stop()


def test_200_concurrent_streams(live):
    """256 blocks of 16 tokens cannot hold 200 requests at once: some get preempted too (or,
    for the host-resident systems, run from the host pool)."""
    preemptions_before = live.call(displaced)
    t0 = time.monotonic()
    results = asyncio.run(_run_all(live.base_url))
    elapsed = time.monotonic() - t0

    assert len(results) == NUM_REQUESTS
    for _text, finish, completion_tokens in results:
        assert finish == "length" and completion_tokens == MAX_TOKENS
    stats = live.call(lambda e: e.get_stats())
    assert stats.num_generation_tokens_total >= NUM_REQUESTS * MAX_TOKENS
    assert live.call(displaced) > preemptions_before
    assert_engine_clean(live)
    assert elapsed < 60, f"{elapsed:.1f} s"
