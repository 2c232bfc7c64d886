"""Slow and excess clients: header/body read timeouts, a connection bound answered with 503,
and accept() failures logged once per interval, not once per attempt."""

from __future__ import annotations

import errno
import logging
import select
import socket
import time

import httpx
import pytest

from kvtier.server.app import build_app
from kvtier.server.connections import ConnectionLimits, _AcceptErrorLog
from tests.server.conftest import MODEL, assert_engine_clean, start_server

HALF_HEADERS = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Ty"
HALF_BODY = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
             b"Content-Length: 1000\r\n\r\n{\"prompt\": \"")
COMPLETION = {"model": MODEL, "prompt": "hello", "max_tokens": 2}


def _open(port: int, payload: bytes, num: int) -> list[socket.socket]:
    socks = []
    for _ in range(num):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        s.sendall(payload)
        socks.append(s)
    return socks


def _wait_closed_by_server(socks: list[socket.socket], timeout_s: float) -> list[bytes]:
    """What the server sent each socket before closing it (bounded wait); raises if any
    socket is still open at the deadline."""
    received = {s: b"" for s in socks}
    open_socks = set(socks)
    deadline = time.monotonic() + timeout_s
    while open_socks and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_socks), [], [], 0.1)
        for s in readable:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if chunk:
                received[s] += chunk
            else:
                open_socks.discard(s)
    assert not open_socks, f"{len(open_socks)} of {len(socks)} slow connections still open"
    return [received[s] for s in socks]


@pytest.fixture
def guarded(engine):
    limits = ConnectionLimits(max_connections=1000, header_timeout_s=0.5, body_timeout_s=0.5)
    srv = start_server(build_app(engine), limits)
    yield srv
    srv.stop()


def test_half_open_sockets_are_timed_out(guarded):
    """300 sockets with half their headers, 100 with half a body: /health still answers
    within 1 s, and each slow socket is closed by the server (the header ones with 408)."""
    headers = _open(guarded.port, HALF_HEADERS, 300)
    bodies = _open(guarded.port, HALF_BODY, 100)
    try:
        t0 = time.monotonic()
        assert httpx.get(guarded.base_url + "/health", timeout=1.0).status_code == 200
        assert time.monotonic() - t0 < 1.0
        got = _wait_closed_by_server(headers + bodies, timeout_s=5.0)
        assert all(g.startswith(b"HTTP/1.1 408") for g in got[:300])
        resp = httpx.post(guarded.base_url + "/v1/completions", json=COMPLETION, timeout=30)
        assert resp.status_code == 200 and resp.json()["usage"]["completion_tokens"] >= 1
    finally:
        for s in headers + bodies:
            s.close()
    assert_engine_clean(guarded)


def test_connections_over_the_limit_get_503(engine):
    srv = start_server(build_app(engine), ConnectionLimits(max_connections=20, header_timeout_s=0.5))
    hogs = _open(srv.port, HALF_HEADERS, 20)
    try:
        resp = httpx.get(srv.base_url + "/health", timeout=5)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "server_overloaded"
        _wait_closed_by_server(hogs, timeout_s=5.0)
        t0 = time.monotonic()
        assert httpx.get(srv.base_url + "/health", timeout=1.0).status_code == 200
        assert time.monotonic() - t0 < 1.0
        assert httpx.post(srv.base_url + "/v1/completions", json=COMPLETION, timeout=30).status_code == 200
    finally:
        for s in hogs:
            s.close()
        srv.stop()


def test_accept_errors_are_logged_once_per_interval(caplog):
    passed_on = []
    handler = _AcceptErrorLog(lambda loop, ctx: passed_on.append(ctx))
    context = {"message": "socket.accept() out of system resource",
               "exception": OSError(errno.EMFILE, "Too many open files")}
    with caplog.at_level(logging.ERROR, logger="kvtier.server.connections"):
        for _ in range(1000):
            handler(None, context)  # type: ignore[arg-type]
    assert len(caplog.records) == 1 and "Too many open files" in caplog.records[0].getMessage()
    assert caplog.records[0].exc_info is None  # one line, no traceback
    handler(None, {"message": "something else"})  # type: ignore[arg-type]
    assert passed_on == [{"message": "something else"}]
