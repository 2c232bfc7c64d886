"""`kvtier serve MODEL`: the OpenAI-compatible server, options named like `vllm serve`'s."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from typing import Any

DEFAULT_PORT = 8000


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `serve` (every EngineArgs option plus the HTTP ones) to a subparsers object."""
    from kvtier.engine.args import EngineArgs

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL over HTTP: /v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics.",
    )
    EngineArgs.add_cli_args(parser)  # positional MODEL, --max-model-len, --kv-policy, ...
    http = parser.add_argument_group("HTTP server")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000)")
    http.add_argument(
        "--api-key",
        default=os.environ.get("KVTIER_API_KEY"),
        help="require 'Authorization: Bearer KEY' on /v1/* (default: $KVTIER_API_KEY)",
    )
    http.add_argument(
        "--max-request-body-bytes",
        type=int,
        default=None,
        help="larger request bodies get 413 (default 8 MiB)",
    )
    http.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds in-flight requests get to finish on SIGTERM before they are aborted",
    )
    http.add_argument("--uvicorn-log-level", default="info",
                      choices=["critical", "error", "warning", "info", "debug", "trace"])
    parser.set_defaults(func=run_serve)
    return parser


def run_serve(args: argparse.Namespace) -> int:
    """Build the engine from the parsed options and serve until SIGINT/SIGTERM."""
    import uvicorn

    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.server.app import DEFAULT_MAX_REQUEST_BODY_BYTES, build_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    app = build_app(
        engine,
        api_key=args.api_key or None,
        max_waiting_requests=args.max_waiting_requests,
        max_request_body_bytes=args.max_request_body_bytes or DEFAULT_MAX_REQUEST_BODY_BYTES,
        shutdown_timeout_s=args.shutdown_timeout,
    )
    # uvicorn handles SIGTERM/SIGINT: it stops listening, waits up to the timeout for open
    # requests, then runs the app's shutdown (which aborts what is left and stops the engine).
    # Afterwards it re-raises the signal into the handlers it found; with these, a graceful
    # shutdown ends the process with status 0 instead of being killed by the re-raised signal.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _after_graceful_shutdown)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.uvicorn_log_level,
        timeout_graceful_shutdown=args.shutdown_timeout,
    )
    return 0


def _after_graceful_shutdown(signum: int, frame: object) -> None:
    logging.getLogger(__name__).info("stopped by signal %d after a graceful shutdown", signum)
