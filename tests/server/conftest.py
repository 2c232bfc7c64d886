"""A real server on a loopback port: uvicorn in a thread, the tiny dummy engine inside."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import uvicorn

from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.model.presets import PRESETS
from kvtier.server.app import build_app
from kvtier.server.connections import ConnectionLimits, KVTierServer, server_config

MODEL = "tiny-llama"
ENGINE_OPTIONS = dict(load_format="dummy", device="cpu", attention_backend="torch",
                      num_gpu_blocks=256, max_model_len=256, max_num_seqs=256,
                      served_model_name=MODEL)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The tiny-llama preset with a 2048-token vocabulary.

    The preset keeps Qwen's 152k vocabulary, so on CPU the logits and sampling of 200
    concurrent requests dominate a step (~2 s); the server tests are about the server.
    """
    cfg = {**PRESETS[MODEL], "vocab_size": 2048}
    path = tmp_path_factory.mktemp("tiny-llama-2k")
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    # Intra-op threads cost more than they give on these tiny tensors (10x on 2 cores),
    # and the engine shares the cores with uvicorn and the clients.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def make_engine(model_dir: str, **overrides: Any) -> LLMEngine:
    return LLMEngine.from_engine_args(EngineArgs(model=model_dir, **{**ENGINE_OPTIONS, **overrides}))


@dataclass
class LiveServer:
    app: Any
    server: uvicorn.Server
    thread: threading.Thread
    port: int

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def engine(self) -> Any:
        return self.app.state.server.engine

    @property
    def async_engine(self) -> Any:
        return self.app.state.server.async_engine

    def call(self, fn: Callable[[Any], Any], timeout: float = 30.0) -> Any:
        """Run fn(engine) on the engine's worker thread, between steps."""
        return self.async_engine.call_threadsafe(fn).result(timeout)

    def wait_idle(self, timeout: float = 20.0) -> Any:
        """Wait (bounded) until the engine has no request left; return its stats."""
        deadline = time.monotonic() + timeout
        while True:
            stats, busy = self.call(lambda e: (e.get_stats(), e.has_unfinished_requests()))
            if not busy or time.monotonic() > deadline:
                return stats
            time.sleep(0.02)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)
        assert not self.thread.is_alive(), "server did not stop"


def start_server(app: Any, limits: ConnectionLimits | None = None, tls: Any = None,
                 root_path: str = "") -> LiveServer:
    """Serve `app` as `kvtier serve` does (its protocol, limits, TLS, root path and draining
    shutdown)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    state = app.state.server
    config = server_config(app, host="127.0.0.1", port=port, limits=limits or ConnectionLimits(),
                           shutdown_timeout_s=state.shutdown_timeout_s, log_level="warning", tls=tls,
                           root_path=root_path)
    server = KVTierServer(config, drain=state.drain)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "server failed to start"
        time.sleep(0.01)
    return LiveServer(app, server, thread, port)


@pytest.fixture(scope="session")
def engine(tiny_model_dir: str) -> LLMEngine:
    """One tiny engine for the session; each server using it is stopped before the next."""
    return make_engine(tiny_model_dir)


@pytest.fixture(scope="module")
def live(engine: LLMEngine) -> Iterator[LiveServer]:
    srv = start_server(build_app(engine))
    yield srv
    srv.stop()


def assert_engine_clean(srv: LiveServer) -> None:
    stats = srv.wait_idle()
    assert stats.num_running == stats.num_waiting == stats.num_swapped == 0
    assert stats.gpu_blocks_used == 0 and stats.host_blocks_used == 0
    srv.call(lambda e: e.check_integrity())


def serve_until_clean(app: Any) -> Iterator[LiveServer]:
    """A module fixture's body: serve `app`, and at the end check the engine came back clean."""
    srv = start_server(app)
    yield srv
    assert_engine_clean(srv)
    srv.stop()


def openai_client(srv: LiveServer) -> Any:
    """The official client on the server (a context manager), no retries."""
    import openai

    return openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0)


# The tool-calling servers (tests/server/test_tool_calls.py, test_responses_api.py): hermes
# parser on, room for the tools' system turn, one step at a time and async.
TOOL_ENGINE = {"max_model_len": 1024, "num_gpu_blocks": 1024}


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def tool_server(request, tiny_model_dir):
    engine = make_engine(tiny_model_dir, async_scheduling=request.param, **TOOL_ENGINE)
    yield from serve_until_clean(build_app(engine, tool_call_parser="hermes"))


@pytest.fixture(scope="module")
def tool_client(tool_server):
    with openai_client(tool_server) as c:
        yield c


@pytest.fixture(scope="module")
def compact(tool_server):
    """logit_bias against every whitespace-only token of the 2,048-token vocabulary: a
    random model otherwise spends its tokens on the whitespace JSON allows between values
    (the grammar still decides where whitespace must go; -inf outside it stays -inf)."""
    tok = tool_server.engine.tokenizer
    space = [i for i in range(2048) if tok.decode([i]) and not tok.decode([i]).strip()]
    return {"logit_bias": {str(i): -100 for i in space}}
