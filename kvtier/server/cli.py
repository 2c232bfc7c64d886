"""`kvtier serve MODEL`: the OpenAI-compatible server, options named like `vllm serve`'s."""

from __future__ import annotations

import argparse
import logging
import os
import signal
from pathlib import Path
from typing import Any

from kvtier.config import ConfigError
from kvtier.server.http_options import (
    add_http_args,
    cors_from_args,
    root_path_from_args,
    tls_from_args,
)
from kvtier.server.logs import ServerLogs
from kvtier.server.reasoning import REASONING_PARSERS
from kvtier.server.stats_log import DEFAULT_INTERVAL_S, INTERVAL_ENV, interval_from_env
from kvtier.server.tool_parsers import PARSERS

DEFAULT_PORT = 8000
API_KEY_ENV = "KVTIER_API_KEY"


def add_serve_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add `serve` (every EngineArgs option plus the HTTP ones) to a subparsers object."""
    from kvtier.engine.args import EngineArgs

    parser = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API",
        description="Serve MODEL over HTTP: /v1/completions, /v1/chat/completions, "
        "/v1/models, /health, /metrics, POST /reset_prefix_cache.",
    )
    EngineArgs.add_cli_args(parser, model_path_flag=True)  # MODEL, --max-model-len, ...
    http = parser.add_argument_group("HTTP server")
    http.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    http.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default 8000)")
    _add_auth_args(http)
    _add_limit_args(http)
    add_http_args(http)
    http.add_argument("--uvicorn-log-level", default="info",
                      choices=["critical", "error", "warning", "info", "debug", "trace"])
    http.add_argument("--disable-log-stats", action="store_true",
                      help="do not log the engine's throughput, queue and KV usage every "
                      f"${INTERVAL_ENV} seconds (default {DEFAULT_INTERVAL_S:g}; vLLM's flag)")
    http.add_argument("--enable-log-requests", action="store_true",
                      help="log each request as it is submitted: its prompt ids and sampling "
                      "parameters (vLLM's flag)")
    http.add_argument("--disable-log-requests", action="store_true",
                      help="vLLM's older flag, accepted: requests are logged only under "
                      "--enable-log-requests")
    http.add_argument("--max-log-len", type=int, default=None,
                      help="prompt ids a logged request shows at most (default: all)")
    http.add_argument("--return-tokens-as-token-ids", action="store_true",
                      help="logprobs name each token 'token_id:{id}' unless a request's "
                      "return_tokens_as_token_ids says otherwise (vLLM's flag)")
    tools = parser.add_argument_group("Tool calling")
    tools.add_argument("--enable-auto-tool-choice", action="store_true",
                       help='tool_choice "auto": calls read from the model\'s own text by '
                       "--tool-call-parser (vLLM's flags)")
    tools.add_argument("--tool-call-parser", choices=sorted(PARSERS), default=None,
                       help="how the model writes its calls: hermes (Qwen 2.5/3, Hermes: "
                       "<tool_call> blocks) or llama3_json (Llama 3.1/3.2)")
    tools.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                       help="a chat reply's thinking (before </think>) as reasoning_content: "
                       "qwen3 (a reply that opens <think>) or deepseek_r1 (the reply starts "
                       "thinking; also Qwen3's thinking-only models)")
    parser.set_defaults(func=run_serve)
    return parser


def _add_auth_args(http: argparse._ArgumentGroup) -> None:
    http.add_argument("--api-key", default=None,
                      help="require 'Authorization: Bearer KEY' on /v1/* and POST "
                      f"/reset_prefix_cache (default: ${API_KEY_ENV}; "
                      "prefer --api-key-file or the variable: argv is visible to every user)")
    http.add_argument("--api-key-file", type=Path, default=None,
                      help="read the API key from this file (surrounding whitespace dropped)")
    http.add_argument("--protect-metrics", action="store_true",
                      help="require the API key on /metrics too (/health always stays open)")
    http.add_argument("--enable-request-id-headers", action="store_true",
                      help="put X-Request-Id on every response: the client's, else a new one "
                      "(vLLM's flag)")


def _add_limit_args(http: argparse._ArgumentGroup) -> None:
    from kvtier.server.connections import ConnectionLimits

    d = ConnectionLimits()
    http.add_argument("--max-request-body-bytes", type=int, default=None,
                      help="larger request bodies get 413 (default 8 MiB)")
    http.add_argument("--max-seqs-per-request", type=int, default=None,
                      help="sequences (prompts x n) one request may ask for; more get 400 "
                      "(default: the waiting bound, --max-waiting-requests)")
    http.add_argument("--max-connections", type=int, default=None,
                      help=f"open connections at most; more get 503 (default: {d.max_connections}, "
                      "or fewer where the open-files limit is lower)")
    http.add_argument("--header-timeout", type=float, default=d.header_timeout_s,
                      help=f"seconds a request's headers may take to arrive (default {d.header_timeout_s:g})")
    http.add_argument("--body-timeout", type=float, default=d.body_timeout_s,
                      help=f"seconds a request body may pause between chunks (default {d.body_timeout_s:g})")
    http.add_argument("--timeout-keep-alive", type=float, default=d.keep_alive_timeout_s,
                      help=f"seconds an idle keep-alive connection stays open (default {d.keep_alive_timeout_s:g})")
    http.add_argument("--request-timeout", type=float, default=None,
                      help="seconds a request may run after admission; then it ends with 408 "
                      "(default: no server-side deadline)")
    http.add_argument("--shutdown-timeout", type=float, default=30.0,
                      help="on SIGTERM: seconds running requests get to finish before each ends "
                      "with a 503 error (new requests get 503 at once)")


def resolve_api_key(args: argparse.Namespace, environ: dict[str, str] | None = None) -> str | None:
    """The key from --api-key, --api-key-file or $KVTIER_API_KEY; an empty one is an error,
    never "no authentication"."""
    env = os.environ if environ is None else environ
    given = [name for name, v in (("--api-key", args.api_key), ("--api-key-file", args.api_key_file))
             if v is not None]
    if len(given) > 1:
        raise ConfigError("pass either --api-key or --api-key-file, not both")
    if args.api_key is not None:
        key, source = args.api_key, "--api-key"
    elif args.api_key_file is not None:
        try:
            key, source = args.api_key_file.read_text().strip(), f"--api-key-file {args.api_key_file}"
        except OSError as exc:
            raise ConfigError(f"cannot read --api-key-file: {exc}") from None
    elif API_KEY_ENV in env:
        key, source = env[API_KEY_ENV], f"${API_KEY_ENV}"
    else:
        if args.protect_metrics:
            raise ConfigError("--protect-metrics needs an API key")
        return None
    if not key.strip():
        raise ConfigError(f"the API key from {source} is empty: give a key, or unset it to serve "
                          "without authentication")
    return key.strip()


def run_serve(args: argparse.Namespace) -> int:
    """Build the engine from the parsed options and serve until SIGINT/SIGTERM."""
    from kvtier.engine.args import EngineArgs
    from kvtier.engine.llm_engine import LLMEngine
    from kvtier.server.app import DEFAULT_MAX_REQUEST_BODY_BYTES, build_app
    from kvtier.server.connections import (
        ConnectionLimits,
        KVTierServer,
        raise_open_files_limit,
        server_config,
    )

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_key = resolve_api_key(args)
    room = raise_open_files_limit()
    max_connections = args.max_connections or min(ConnectionLimits().max_connections, room)
    try:
        limits = ConnectionLimits(max_connections=max_connections, header_timeout_s=args.header_timeout,
                                  body_timeout_s=args.body_timeout,
                                  keep_alive_timeout_s=args.timeout_keep_alive)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if args.enable_auto_tool_choice and args.tool_call_parser is None:
        raise ConfigError("--enable-auto-tool-choice needs --tool-call-parser")
    tls, root_path = tls_from_args(args), root_path_from_args(args)  # checked before the engine loads
    logs = logs_from_args(args)
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))
    try:
        app = build_app(
            engine,
            api_key=api_key,
            metrics_need_key=args.protect_metrics,
            max_waiting_requests=args.max_waiting_requests,
            max_seqs_per_request=args.max_seqs_per_request,
            max_request_body_bytes=args.max_request_body_bytes or DEFAULT_MAX_REQUEST_BODY_BYTES,
            shutdown_timeout_s=args.shutdown_timeout,
            request_timeout_s=args.request_timeout,
            tool_call_parser=args.tool_call_parser if args.enable_auto_tool_choice else None,
            reasoning_parser=args.reasoning_parser,
            cors=cors_from_args(args),
            logs=logs,
            return_tokens_as_token_ids=args.return_tokens_as_token_ids,
            request_id_headers=args.enable_request_id_headers,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    # uvicorn handles SIGTERM/SIGINT: it stops listening, the app drains (new requests 503,
    # running ones finish or end with an error after --shutdown-timeout), then the app's
    # shutdown stops the engine. Afterwards uvicorn re-raises the signal into the handlers
    # it found; with these, a graceful shutdown ends the process with status 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _after_graceful_shutdown)
    config = server_config(app, host=args.host, port=args.port, limits=limits,
                           shutdown_timeout_s=args.shutdown_timeout, log_level=args.uvicorn_log_level,
                           tls=tls, root_path=root_path, access_log=not args.disable_uvicorn_access_log)
    KVTierServer(config, drain=app.state.server.drain).run()
    return 0


def logs_from_args(args: argparse.Namespace) -> ServerLogs:
    """The stats line every $KVTIER_LOG_STATS_INTERVAL s unless --disable-log-stats; the
    request lines under --enable-log-requests."""
    if args.enable_log_requests and args.disable_log_requests:
        raise ConfigError("--enable-log-requests and --disable-log-requests contradict each other")
    try:
        return ServerLogs(stats_interval_s=None if args.disable_log_stats else interval_from_env(),
                          requests=args.enable_log_requests, max_log_len=args.max_log_len)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _after_graceful_shutdown(signum: int, frame: object) -> None:
    logging.getLogger(__name__).info("stopped by signal %d after a graceful shutdown", signum)
