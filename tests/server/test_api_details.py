"""The published schema and validation messages, API-key details, and small API gaps:
HEAD /metrics, continuous usage stats, `python -m kvtier`."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import httpx
import pytest

from kvtier.config import ConfigError
from kvtier.server.app import build_app
from kvtier.server.cli import resolve_api_key
from tests.server.conftest import MODEL, start_server

KEY = "sk-details"


def _walk(node):
    if isinstance(node, dict):
        yield node
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


def test_openapi_publishes_json_schema_limits_and_no_422(live):
    schema = httpx.get(live.base_url + "/openapi.json").json()
    nodes = list(_walk(schema))
    assert not [n for n in nodes if "ge" in n or "le" in n]
    props = schema["components"]["schemas"]["CompletionRequest"]["properties"]
    assert props["n"]["minimum"] == 1 and props["n"]["maximum"] == 128
    for path in schema["paths"].values():
        for operation in path.values():
            assert "422" not in operation["responses"]
    assert "HTTPValidationError" not in schema["components"]["schemas"]


def _post_raw(base_url: str, text: str) -> httpx.Response:
    return httpx.post(base_url + "/v1/completions", content=text.encode(),
                      headers={"content-type": "application/json"}, timeout=30)


def test_validation_messages_name_no_internal_types(live):
    for body, param in [('{"prompt": [1.5]}', "prompt"), ('{"prompt": 5}', "prompt"),
                        ('{"prompt": "x", "stop": 5}', "stop"), ('{"prompt": [[true]]}', "prompt")]:
        resp = _post_raw(live.base_url, body)
        assert resp.status_code == 400
        message = resp.json()["error"]["message"]
        for internal in ("function-before", "_integral", "constrained-str", "list[", "[str]"):
            assert internal not in message, message
        assert resp.json()["error"]["param"] == param
    nan = _post_raw(live.base_url, f'{{"model": "{MODEL}", "prompt": "x", "temperature": NaN}}')
    assert nan.status_code == 400 and "NaN" in nan.json()["error"]["message"]
    assert nan.json()["error"]["param"] == "temperature"


def test_head_metrics_and_health(live):
    assert httpx.head(live.base_url + "/metrics").status_code == 200
    assert httpx.head(live.base_url + "/health").status_code == 200


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats(live, path):
    body = {"model": MODEL, "max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    body.update({"prompt": "count"} if path == "/v1/completions"
                else {"messages": [{"role": "user", "content": "count"}]})
    with httpx.stream("POST", live.base_url + path, json=body, timeout=30) as resp:
        chunks = [json.loads(line[6:]) for line in resp.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion == sorted(completion) and completion[-1] == 5
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)


def test_python_m_kvtier():
    out = subprocess.run([sys.executable, "-m", "kvtier", "serve", "--help"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "--api-key-file" in out.stdout


# ----------------------------------------------------------------------------- auth
@pytest.fixture(scope="module")
def keyed_metrics(engine):
    srv = start_server(build_app(engine, api_key=KEY, metrics_need_key=True))
    yield srv
    srv.stop()


def test_bearer_scheme_is_case_insensitive_and_metrics_can_need_the_key(keyed_metrics):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 2}
    with httpx.Client(base_url=keyed_metrics.base_url, timeout=30) as http:
        for scheme in ("Bearer", "bearer", "BEARER"):
            resp = http.post("/v1/completions", json=body, headers={"Authorization": f"{scheme} {KEY}"})
            assert resp.status_code == 200
        assert http.get("/metrics").status_code == 401
        assert http.get("/metrics", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
        assert http.get("/health").status_code == 200  # probes stay open


def _args(**overrides) -> argparse.Namespace:
    return argparse.Namespace(**{"api_key": None, "api_key_file": None, "protect_metrics": False,
                                 **overrides})


def test_api_key_sources(tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text("  from-file\n")
    assert resolve_api_key(_args(api_key_file=key_file), environ={}) == "from-file"
    assert resolve_api_key(_args(), environ={"KVTIER_API_KEY": "from-env"}) == "from-env"
    assert resolve_api_key(_args(api_key="given"), environ={"KVTIER_API_KEY": "env"}) == "given"
    assert resolve_api_key(_args(), environ={}) is None
    empty = tmp_path / "empty"
    empty.write_text("\n")
    for args, env in [(_args(api_key=""), {}), (_args(api_key="  "), {}), (_args(), {"KVTIER_API_KEY": ""}),
                      (_args(api_key_file=empty), {}), (_args(protect_metrics=True), {}),
                      (_args(api_key="a", api_key_file=key_file), {})]:
        with pytest.raises(ConfigError):
            resolve_api_key(args, environ=env)
    with pytest.raises(ValueError, match="empty"):
        build_app(object(), api_key="")
