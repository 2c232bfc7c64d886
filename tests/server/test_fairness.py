"""Admission counts sequences (prompts x n), caps them per request, and a later small request
is not held behind every sequence of a big one (the round-robin backlog)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server


async def _first_token(client: httpx.AsyncClient, body: dict):
    """Open a stream and return (response, line iterator) once its first chunk arrived."""
    resp = await client.send(client.build_request("POST", "/v1/completions", json=body), stream=True)
    lines = resp.aiter_lines()
    while not (await lines.__anext__()).startswith("data: "):
        pass
    return resp, lines


def test_admission_counts_sequences_and_caps_them(tiny_model_dir):
    """Two running slots (one n=2 request), 5 waiting places. A waiting 2 prompts x n=2
    holds 4 of them, so one prompt with n=2 more is refused (counting prompts, 3 <= 5, it
    was admitted); more sequences than the cap (default: the 5 places) is a 400."""
    srv = start_server(build_app(make_engine(tiny_model_dir, max_num_seqs=2), max_waiting_requests=5))
    long = {"model": MODEL, "max_tokens": 200, "ignore_eos": True}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            running, _ = await _first_token(client, {**long, "prompt": "run", "n": 2, "stream": True})
            waiting = asyncio.create_task(client.post("/v1/completions",
                                                      json={**long, "prompt": ["a", "b"], "n": 2}))
            deadline = time.monotonic() + 10
            while srv.async_engine.num_pending < 4:
                assert time.monotonic() < deadline, "the waiting request never arrived"
                await asyncio.sleep(0.01)
            refused = await client.post("/v1/completions", json={**long, "prompt": "c", "n": 2})
            assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
            assert "4 sequences are waiting" in refused.json()["error"]["message"]
            too_many = await client.post("/v1/completions", json={**long, "prompt": ["x"] * 3, "n": 2})
            assert too_many.status_code == 400
            err = too_many.json()["error"]
            assert err["code"] == "too_many_sequences" and "at most 5 sequences" in err["message"]
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
            await running.aclose()

    try:
        asyncio.run(scenario())
        assert_engine_clean(srv)
    finally:
        srv.stop()


def test_small_request_is_not_held_behind_a_big_one(tiny_model_dir):
    """The issue's case scaled to CPU: 12 prompts x n=2 (24 sequences) on 2 running slots,
    then a 2-token request. First-come first-served it would finish after all 24; with
    the round-robin backlog it waits behind at most a batch of them."""
    srv = start_server(build_app(make_engine(tiny_model_dir, max_num_seqs=2), max_waiting_requests=64))
    big = {"model": MODEL, "prompt": ["hello"] * 12, "n": 2, "max_tokens": 16, "ignore_eos": True,
           "stream": True}
    small = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}

    async def scenario() -> tuple[int, int]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            resp, lines = await _first_token(client, big)
            small_task = asyncio.create_task(client.post("/v1/completions", json=small))
            num_finished, finished_before_small = 0, None
            async for line in lines:
                if small_task.done() and finished_before_small is None:
                    finished_before_small = num_finished
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    num_finished += sum(c["finish_reason"] is not None for c in chunk["choices"])
            await resp.aclose()
            assert (await small_task).status_code == 200
            return num_finished, num_finished if finished_before_small is None else finished_before_small

    try:
        num_finished, before_small = asyncio.run(scenario())
        assert num_finished == 24
        assert before_small <= 8, f"{before_small} of the big request's 24 sequences finished first"
        assert_engine_clean(srv)
    finally:
        srv.stop()
