"""SIGTERM past --shutdown-timeout: new requests get 503 + Retry-After, running ones end with
an OpenAI-style error (a 503 JSON body, or an SSE error event and [DONE]), exit status 0."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, make_engine, start_server

LONG = {"model": MODEL, "max_tokens": 250, "ignore_eos": True, "temperature": 0}


async def _one(client: httpx.AsyncClient, i: int, stream: bool, started: asyncio.Event) -> dict:
    body = {**LONG, "prompt": f"drain {i}", "stream": stream}
    async with client.stream("POST", "/v1/completions", json=body) as resp:
        if not stream:
            started.set()
            return {"status": resp.status_code, "body": json.loads(await resp.aread()),
                    "retry_after": resp.headers.get("retry-after")}
        events = []
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                started.set()
        return {"status": resp.status_code, "events": events}


def _check_outcomes(outcomes: list[dict]) -> int:
    """Each request either finished or ended with an OpenAI-style 503; returns how many ended."""
    num_ended = 0
    for out in outcomes:
        if "events" in out:
            assert out["status"] == 200 and out["events"][-1] == "[DONE]"
            last = json.loads(out["events"][-2])
            if "error" in last:
                assert last["error"]["type"] == "service_unavailable"
                assert "shutting down" in last["error"]["message"]
                num_ended += 1
            else:
                assert last["choices"][0]["finish_reason"] == "length"
        elif out["status"] == 503:
            assert out["body"]["error"]["type"] == "service_unavailable" and out["retry_after"] == "1"
            num_ended += 1
        else:
            assert out["status"] == 200, out
    return num_ended


def _late_request(port: int) -> tuple[socket.socket, bytes]:
    """A request whose body is still on its way (the rest returned): its handler runs after
    SIGTERM."""
    body = json.dumps({"model": MODEL, "prompt": "late", "max_tokens": 2}).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
    return s, body[5:]


def _read_response(s: socket.socket) -> bytes:
    """One whole HTTP response: its head and Content-Length bytes of body (they may come in
    separate segments)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536) or b"\r\n\r\n"
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_drain_ends_running_requests_with_errors(tiny_model_dir):
    """The issue's case, in process: 4 running slots, 8 long requests, SIGTERM while they run."""
    srv = start_server(build_app(make_engine(tiny_model_dir, max_num_seqs=4), shutdown_timeout_s=0.5))

    async def scenario() -> tuple[list[dict], bytes]:
        started = asyncio.Event()
        async with httpx.AsyncClient(base_url=srv.base_url, timeout=60) as client:
            tasks = [asyncio.create_task(_one(client, i, i % 2 == 0, started)) for i in range(8)]
            await asyncio.wait_for(started.wait(), 30)
            late, rest = _late_request(srv.port)
            await asyncio.sleep(0.1)
            srv.server.handle_exit(signal.SIGTERM, None)
            await asyncio.sleep(0.2)  # the drain has begun
            late.sendall(rest)
            reply = await asyncio.to_thread(_read_response, late)
            late.close()
            return await asyncio.gather(*tasks), reply

    outcomes, late_reply = asyncio.run(scenario())
    srv.thread.join(30)
    assert not srv.thread.is_alive()
    assert _check_outcomes(outcomes) >= 1  # 8 x 250 tokens on 4 slots outlast 0.5 s
    head, _, body = late_reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503") and b"retry-after: 1" in head.lower()
    assert json.loads(body)["error"]["message"] == "the server is shutting down"
    assert not srv.engine.has_unfinished_requests() and srv.engine.get_stats().gpu_blocks_used == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_past_the_timeout_exits_0(tiny_model_dir, tmp_path):
    """`kvtier serve --shutdown-timeout 1 --max-num-seqs 4`, 8 long requests, SIGTERM: every
    client gets a finished answer or an OpenAI-style 503, and the process exits 0 (16 requests
    here, so that some are still running when the timeout ends)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "kvtier", "serve", tiny_model_dir, "--load-format", "dummy",
           "--device", "cpu", "--attention-backend", "torch", "--max-model-len", "256",
           "--num-gpu-blocks", "256", "--max-num-seqs", "4", "--served-model-name", MODEL,
           "--port", str(port), "--shutdown-timeout", "1", "--uvicorn-log-level", "warning"]
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"})
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)

        async def scenario() -> list[dict]:
            started = asyncio.Event()
            async with httpx.AsyncClient(base_url=base, timeout=60) as client:
                # 16 requests, 4 waves on 4 seats: on a fast CPU two waves of 250 tokens can
                # end inside the 1 s timeout, and then no request is left to cut.
                tasks = [asyncio.create_task(_one(client, i, i % 2 == 0, started))
                         for i in range(16)]
                await asyncio.wait_for(started.wait(), 30)
                proc.send_signal(signal.SIGTERM)
                return await asyncio.gather(*tasks)

        outcomes = asyncio.run(scenario())
        assert _check_outcomes(outcomes) >= 1
        assert proc.wait(30) == 0, log.read_text()
        assert "Cancel" not in log.read_text()  # uvicorn never had to cancel a task
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
