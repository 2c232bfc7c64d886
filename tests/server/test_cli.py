"""`kvtier serve` as a user runs it: a subprocess that serves, then exits cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai

from tests.server.conftest import MODEL


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_then_sigterm(tiny_model_dir, tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "kvtier.cli", "serve", tiny_model_dir, "--load-format", "dummy",
           "--device", "cpu", "--attention-backend", "torch", "--max-model-len", "128",
           "--num-gpu-blocks", "64", "--served-model-name", MODEL, "--host", "127.0.0.1",
           "--port", str(port), "--api-key", "k3y", "--shutdown-timeout", "5",
           "--uvicorn-log-level", "warning"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, f"exit {proc.returncode}: {log.read_text()}"
            assert time.monotonic() < deadline, "server did not come up: " + log.read_text()
            try:
                if httpx.get(base + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        with openai.OpenAI(base_url=base + "/v1", api_key="k3y", max_retries=0) as client:
            out = client.chat.completions.create(model=MODEL, max_tokens=3, extra_body={"ignore_eos": True},
                                                 messages=[{"role": "user", "content": "hi"}])
            assert out.usage.completion_tokens == 3
        assert httpx.get(base + "/v1/models").status_code == 401  # the key is enforced
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_auto_tool_choice_needs_a_parser(tiny_model_dir):
    """Refused before the engine is built, naming the missing flag (vLLM's pairing)."""
    cmd = [sys.executable, "-m", "kvtier.cli", "serve", tiny_model_dir, "--load-format", "dummy",
           "--device", "cpu", "--enable-auto-tool-choice"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "--tool-call-parser" in done.stderr, done.stderr
    bad = subprocess.run(cmd + ["--tool-call-parser", "nope"], capture_output=True, text=True,
                         timeout=120)
    assert bad.returncode != 0 and "hermes" in bad.stderr
