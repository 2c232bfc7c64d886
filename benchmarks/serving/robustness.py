"""Serving robustness figures (issue 24 items 1-4) against a `kvtier serve` subprocess.

    python -m benchmarks.serving.robustness {slow,sigterm,fairness,refusals} [--code DIR]

`--code DIR` runs the server from another checkout (PYTHONPATH=DIR), to measure a before
and an after with the same client. The model is tiny-llama with random weights and a
2,048-token vocabulary on the CPU (as tests/server), so the figures are about the server.
Each run writes results/serving/<scenario>-<label>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import write_result

MODEL = "tiny-llama"


def _model_dir() -> str:
    from kvtier.model.presets import PRESETS

    path = Path(tempfile.mkdtemp(prefix="tiny-llama-2k-"))
    (path / "config.json").write_text(json.dumps({**PRESETS[MODEL], "vocab_size": 2048}))
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serve(code: str, log: Path, *extra: str, nofile: int | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`kvtier serve` from checkout `code`; `nofile`: its open-files limit (soft and hard)."""
    port = _free_port()
    cmd = [sys.executable, "-m", "kvtier.cli", "serve", _model_dir(), "--load-format", "dummy",
           "--device", "cpu", "--attention-backend", "torch", "--served-model-name", MODEL,
           "--port", str(port), "--uvicorn-log-level", "warning", *extra]
    env = {**os.environ, "PYTHONPATH": code, "OMP_NUM_THREADS": "1"}
    with open(log, "wb") as out:
        # cwd too: `python -m` puts the working directory first on sys.path.
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=code,
                                preexec_fn=None if nofile is None else lambda: _limit_files(nofile))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not come up: {log.read_text()[-2000:]}")
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        yield base, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def _limit_files(nofile: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[float], q: float) -> float | None:
    return statistics.quantiles(values, n=100)[int(q) - 1] if len(values) >= 2 else (values or [None])[0]


# ----------------------------------------------------------------------------- 1. slow clients
def _closed_by_peer(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        while s.recv(65536):
            pass  # a 408 before the close
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True

def slow(base: str, proc: subprocess.Popen, args: argparse.Namespace) -> dict[str, Any]:
    """N sockets with half their headers: /health latency beside them, and how many the
    server still holds open `wait_s` later."""
    port = int(base.rsplit(":", 1)[1])
    socks = []
    for _ in range(args.num_sockets):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Ty")
        socks.append(s)
    latencies: list[tuple[float, int | str]] = []
    for _ in range(5):
        t0 = time.monotonic()
        try:
            status: int | str = httpx.get(base + "/health", timeout=5).status_code
        except httpx.HTTPError as exc:
            status = type(exc).__name__
        latencies.append((time.monotonic() - t0, status))
    time.sleep(args.wait_s)
    closed = sum(_closed_by_peer(s) for s in socks)
    for s in socks:
        s.close()
    t0 = time.monotonic()
    try:
        completion: int | str = httpx.post(base + "/v1/completions", timeout=30,
                                           json={"model": MODEL, "prompt": "hi", "max_tokens": 2}).status_code
    except httpx.HTTPError as exc:
        completion = type(exc).__name__
    return {"num_sockets": args.num_sockets, "server_nofile": args.server_nofile,
            "completion_after_wait_s": time.monotonic() - t0, "health_latency_s": [t for t, _ in latencies],
            "health_status": [s for _, s in latencies], "wait_s": args.wait_s,
            "still_open_after_wait": args.num_sockets - closed, "completion_status": completion}


# ----------------------------------------------------------------------------- 2. SIGTERM
async def _long_request(client: httpx.AsyncClient, i: int, stream: bool) -> dict[str, Any]:
    body = {"model": MODEL, "prompt": f"long {i}", "max_tokens": 3000, "ignore_eos": True, "stream": stream}
    try:
        async with client.stream("POST", "/v1/completions", json=body) as resp:
            raw = (await resp.aread()).decode(errors="replace")
        out: dict[str, Any] = {"stream": stream, "status": resp.status_code,
                               "content_type": resp.headers.get("content-type")}
        if stream:
            events = [line[6:] for line in raw.splitlines() if line.startswith("data: ")]
            out.update(ended_with_done=bool(events) and events[-1] == "[DONE]",
                       error_event=any('"error"' in e for e in events[-2:]))
        else:
            out["body"] = raw[:200]
        return out
    except httpx.HTTPError as exc:
        return {"stream": stream, "transport_error": type(exc).__name__}


def sigterm(base: str, proc: subprocess.Popen, args: argparse.Namespace) -> dict[str, Any]:
    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=base, timeout=120) as client:
            tasks = [asyncio.create_task(_long_request(client, i, i % 2 == 0)) for i in range(8)]
            await asyncio.sleep(2.0)
            proc.send_signal(signal.SIGTERM)
            return await asyncio.gather(*tasks)

    t0 = time.monotonic()
    outcomes = asyncio.run(run())
    return {"outcomes": outcomes, "exit_code": proc.wait(60), "seconds_to_exit": time.monotonic() - t0}


# ----------------------------------------------------------------------------- 3. fairness
def fairness(base: str, proc: subprocess.Popen, args: argparse.Namespace) -> dict[str, Any]:
    big = {"model": MODEL, "prompt": ["hello"] * args.prompts, "n": args.n, "max_tokens": args.big_max_tokens,
           "ignore_eos": True}
    small = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}

    async def run() -> dict[str, Any]:
        async with httpx.AsyncClient(base_url=base, timeout=600) as client:
            t0 = time.monotonic()
            big_task = asyncio.create_task(client.post("/v1/completions", json=big))
            await asyncio.sleep(1.0)
            t1 = time.monotonic()
            small_resp = await client.post("/v1/completions", json=small)
            small_s = time.monotonic() - t1
            big_resp = await big_task
            return {"big_status": big_resp.status_code, "big_s": time.monotonic() - t0,
                    "big_error": big_resp.json().get("error") if big_resp.status_code != 200 else None,
                    "small_status": small_resp.status_code, "small_latency_s": small_s}

    return {"big_sequences": args.prompts * args.n, "big_max_tokens": args.big_max_tokens,
            "small_sent_after_s": 1.0, **asyncio.run(run())}


# ----------------------------------------------------------------------------- 4. refusals
async def _timed(client: httpx.AsyncClient, body: dict) -> tuple[int, float]:
    t0 = time.monotonic()
    try:
        status = (await client.post("/v1/completions", json=body)).status_code
    except httpx.HTTPError:
        status = -1
    return status, time.monotonic() - t0


def _raw_burst(port: int, body: dict, num: int) -> list[tuple[int, float]]:
    """`num` requests at once over raw sockets (an HTTP client in Python would spend more
    time per request than the server): (status, seconds from its send to its status line)."""
    import selectors

    payload = json.dumps(body).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(payload)) + payload
    socks = [socket.create_connection(("127.0.0.1", port), timeout=60) for _ in range(num)]
    sel = selectors.DefaultSelector()
    sent: dict[socket.socket, float] = {}
    for s in socks:
        s.sendall(request)
        sent[s] = time.monotonic()
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    results: list[tuple[int, float]] = []
    deadline = time.monotonic() + 300
    while len(results) < num and time.monotonic() < deadline:
        for key, _ in sel.select(timeout=1.0):
            s = key.fileobj
            head = s.recv(64)  # type: ignore[union-attr]
            status = int(head.split(b" ", 2)[1]) if head.startswith(b"HTTP/") else -1
            results.append((status, time.monotonic() - sent[s]))  # type: ignore[index]
            sel.unregister(s)
            s.close()  # type: ignore[union-attr]
    for s in socks:
        s.close()
    return results


def refusals(base: str, proc: subprocess.Popen, args: argparse.Namespace) -> dict[str, Any]:
    small = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)

    async def huge() -> tuple[list[tuple[int, float]], tuple[int, float]]:
        prompt = "lorem ipsum " * (args.huge_bytes // 12)
        async with httpx.AsyncClient(base_url=base, timeout=600, limits=limits) as client:
            tasks = [asyncio.create_task(_timed(client, {**small, "prompt": prompt})) for _ in range(args.num_huge)]
            await asyncio.sleep(0.5)
            small_result = await _timed(client, small)
            return await asyncio.gather(*tasks), small_result

    results = _raw_burst(int(base.rsplit(":", 1)[1]), {**small, "max_tokens": 64, "ignore_eos": True},
                         args.concurrency)
    refused = [t for s, t in results if s == 503]
    rss_before = _rss_mb(proc.pid)
    huge_results, (small_status, small_s) = asyncio.run(huge())
    return {
        "concurrency": args.concurrency,
        "statuses": {str(s): sum(r[0] == s for r in results) for s in {r[0] for r in results}},
        "time_to_503_p50_s": _pct(refused, 50), "time_to_503_p95_s": _pct(refused, 95),
        "num_huge": args.num_huge, "huge_bytes": args.huge_bytes,
        "huge_statuses": [s for s, _ in huge_results], "huge_latency_max_s": max(t for _, t in huge_results),
        "small_beside_huge_status": small_status, "small_beside_huge_latency_s": small_s,
        "rss_growth_mb": _rss_mb(proc.pid) - rss_before,
    }


SCENARIOS = {"slow": (slow, []), "sigterm": (sigterm, ["--shutdown-timeout", "3", "--max-num-seqs", "4",
                                                       "--max-model-len", "4096", "--num-gpu-blocks", "2048"]),
             "fairness": (fairness, ["--max-num-seqs", "8", "--num-gpu-blocks", "1024"]),
             "refusals": (refusals, ["--max-num-seqs", "32", "--max-model-len", "4096",
                                     "--num-gpu-blocks", "1024"])}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--code", default=str(Path(__file__).resolve().parents[2]),
                   help="checkout whose kvtier serves (default: this one)")
    p.add_argument("--label", default="after")
    p.add_argument("--out-dir", default="results/serving")
    p.add_argument("--num-sockets", type=int, default=2000)
    p.add_argument("--wait-s", type=float, default=12.0)
    p.add_argument("--server-nofile", type=int, default=None, help="slow: the server's open-files limit")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--big-max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=2000)
    p.add_argument("--num-huge", type=int, default=20)
    p.add_argument("--huge-bytes", type=int, default=2_000_000)
    args = p.parse_args()
    fn, server_args = SCENARIOS[args.scenario]
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    log = (out_dir / f"{args.scenario}-{args.label}.log").resolve()
    with serve(args.code, log, *server_args, nofile=args.server_nofile) as (base, proc):
        result = fn(base, proc, args)
    result["server_log_bytes"] = log.stat().st_size
    write_result(out_dir / f"{args.scenario}-{args.label}.json",
                 {"scenario": args.scenario, "label": args.label, "server_code": args.code,
                  "server_args": server_args, **result})
    print(json.dumps(result, indent=1)[:3000])


if __name__ == "__main__":
    main()
