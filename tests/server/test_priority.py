"""vLLM's `priority` request field: a 400 naming it unless the server schedules by priority;
with `--scheduling-policy priority`, both endpoints take it and answer as usual."""

from __future__ import annotations

import httpx

from kvtier.cli import build_parser
from kvtier.engine.args import EngineArgs
from kvtier.server.app import build_app
from tests.server.conftest import MODEL, make_engine, serve_until_clean
from tests.server.test_errors import assert_error

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.base_url + path, json={"model": MODEL, "max_tokens": 2, **body}, timeout=60)


def test_priority_needs_the_policy(tiny_model_dir):
    for srv in serve_until_clean(build_app(make_engine(tiny_model_dir))):
        assert_error(_post(srv, "/v1/completions", {"prompt": "hi", "priority": 1}), 400, "priority")
        assert_error(_post(srv, "/v1/chat/completions", {**CHAT, "priority": -3}), 400, "priority")
        assert _post(srv, "/v1/completions", {"prompt": "hi", "priority": 0}).status_code == 200


def test_both_endpoints_take_it_under_the_policy(tiny_model_dir):
    engine = make_engine(tiny_model_dir, schedule_policy="priority")
    for srv in serve_until_clean(build_app(engine)):
        out = _post(srv, "/v1/completions", {"prompt": "hi", "priority": 5}).json()
        assert out["usage"]["completion_tokens"] == 2
        chat = _post(srv, "/v1/chat/completions", {**CHAT, "priority": -1})
        assert chat.status_code == 200, chat.text
        assert_error(_post(srv, "/v1/completions", {"prompt": "hi", "priority": 1.5}), 400, "priority")


def test_vllms_flag_spelling():
    args = build_parser().parse_args(["serve", MODEL, "--scheduling-policy", "priority"])
    assert EngineArgs.from_cli_args(args).schedule_policy == "priority"
