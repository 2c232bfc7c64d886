"""A step that raises ends the requests it computed with an error; the others go on."""

from __future__ import annotations

import asyncio
import time

import httpx

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, assert_engine_clean, make_engine, start_server

POISON = 1999  # a token id the runner below "cannot handle"


def _poison_executor(engine) -> None:
    """Make the runner's forward fail on any step that computes a prompt holding POISON
    (as it once did in index_select on a prompt of no tokens): after the runner took the
    step's bookkeeping (block tables), before any token."""
    runner = engine.executor
    launch, logits = runner.launch, runner.forward_logits
    poisoned = [False]

    def launch_noting_poison(plan):
        poisoned[0] = any(POISON in sr.token_ids for sr in plan.scheduled)
        return launch(plan)

    def failing_logits(batch, *rest):
        if poisoned[0]:
            raise IndexError("index out of range in self")
        return logits(batch, *rest)

    runner.launch, runner.forward_logits = launch_noting_poison, failing_logits


def test_failing_request_gets_an_error_the_others_go_on(tiny_model_dir):
    """One running slot: the poisoned request runs alone, one sent after it waits. The
    poisoned one gets a 500 (its stream an error event), the waiting one and every later
    request are served, /health stays 200, and no block is left behind."""
    engine = make_engine(tiny_model_dir, max_num_seqs=1)
    _poison_executor(engine)
    srv = start_server(build_app(engine))
    ok = {"model": MODEL, "prompt": "fine", "max_tokens": 4, "ignore_eos": True}
    poisoned = {"model": MODEL, "prompt": [5, 6, POISON], "max_tokens": 4}

    async def scenario() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=30) as client:
            bad = asyncio.create_task(client.post("/v1/completions", json=poisoned))
            await asyncio.sleep(0.05)
            good = asyncio.create_task(client.post("/v1/completions", json=ok))
            return await bad, await good

    try:
        bad, good = asyncio.run(scenario())
        assert bad.status_code == 500 and bad.json()["error"]["code"] == "engine_error"
        assert "IndexError" in bad.json()["error"]["message"]
        assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 4
        with httpx.stream("POST", srv.base_url + "/v1/completions", json={**poisoned, "stream": True}) as r:
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and '"type":"server_error"' in lines[-2]
        assert httpx.get(srv.base_url + "/health").status_code == 200
        again = httpx.post(srv.base_url + "/v1/completions", json=ok, timeout=30)
        assert again.status_code == 200
        assert_engine_clean(srv)
    finally:
        srv.stop()


def test_request_timeout_ends_requests_with_408(tiny_model_dir):
    """--request-timeout: a request still running after it ends with 408 (an SSE error event
    then [DONE] when streamed), its blocks freed; quick requests are untouched."""
    srv = start_server(build_app(make_engine(tiny_model_dir), request_timeout_s=0.3))
    long = {"model": MODEL, "prompt": "slow", "max_tokens": 250, "ignore_eos": True}
    try:
        with httpx.Client(base_url=srv.base_url, timeout=30) as http:
            quick = http.post("/v1/completions", json={**long, "max_tokens": 2})
            assert quick.status_code == 200
            srv.call(lambda e: setattr(e, "step", _slowed(e.step)))
            resp = http.post("/v1/completions", json=long)
            assert resp.status_code == 408 and resp.json()["error"]["code"] == "request_timeout"
            with http.stream("POST", "/v1/completions", json={**long, "stream": True}) as r:
                lines = [line for line in r.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]" and "request timeout" in lines[-2]
            # the server ended them: no client aborts
            assert "kvtier:request_client_aborted_total 0.0" in http.get("/metrics").text
        assert_engine_clean(srv)
    finally:
        srv.stop()


def test_a_call_the_engine_finished_in_time_keeps_its_results_past_the_deadline():
    """The engine finished before the deadline; the client reads after it: no 408, no
    abort, the result whole (the deadline ends running requests, not slow readers)."""
    from kvtier.server.state import _expire
    from kvtier.server.streams import RequestStream
    from kvtier.server.updates import RequestUpdate

    class Owner:
        aborted: list[str] = []

        def abort(self, ids):
            self.aborted += list(ids)
            return len(ids)

    async def read_late() -> list[RequestUpdate]:
        owner = Owner()
        stream = RequestStream(["a"], owner)
        stream.put(RequestUpdate("a", 3, (), finished=True))
        _expire(stream, 0.1)  # the deadline passes before the client reads
        got = [u async for u in stream]
        assert not owner.aborted
        return got

    assert [u.finished for u in asyncio.run(read_late())] == [True]


def _slowed(step):
    def slow_step():
        time.sleep(0.01)  # 250 tokens then take > 2.5 s, well past the 0.3 s deadline
        return step()

    return slow_step
