"""`kvtier serve`'s HTTP options as vLLM names them: CORS, --root-path, TLS."""

from __future__ import annotations

import argparse
import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import openai
import pytest

from kvtier.config import ConfigError
from kvtier.server.app import build_app
from kvtier.server.cli import add_serve_parser
from kvtier.server.http_options import (
    CorsOptions,
    TLSOptions,
    cors_from_args,
    root_path_from_args,
    tls_from_args,
)
from tests.server.conftest import MODEL, start_server

PAGE = "https://page.example"
PREFLIGHT = {"Origin": PAGE, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization, content-type"}


def _serve_args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", "m", *flags])


@pytest.fixture(scope="module")
def keyed(engine):
    srv = start_server(build_app(engine, api_key="k3y"))
    yield srv
    srv.stop()


def test_a_browser_preflight_is_answered_without_the_key(keyed):
    r = httpx.options(keyed.base_url + "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == "*"
    assert "POST" in r.headers["access-control-allow-methods"]


def test_a_refusal_and_an_answer_both_carry_the_cors_header(keyed):
    refused = httpx.get(keyed.base_url + "/v1/models", headers={"Origin": PAGE})
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "*"
    ok = httpx.get(keyed.base_url + "/v1/models", headers={"Origin": PAGE, "Authorization": "Bearer k3y"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "*"


def test_only_the_listed_origins_are_allowed(engine):
    srv = start_server(build_app(engine, cors=CorsOptions(allowed_origins=(PAGE,), allow_credentials=True)))
    try:
        listed = httpx.options(srv.base_url + "/v1/completions", headers=PREFLIGHT)
        assert listed.status_code == 200 and listed.headers["access-control-allow-origin"] == PAGE
        assert listed.headers["access-control-allow-credentials"] == "true"
        other = httpx.options(srv.base_url + "/v1/completions", headers={**PREFLIGHT, "Origin": "https://x.example"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers
        simple = httpx.get(srv.base_url + "/v1/models", headers={"Origin": "https://x.example"})
        assert simple.status_code == 200 and "access-control-allow-origin" not in simple.headers
    finally:
        srv.stop()


def test_no_cors_sends_no_cors_headers(engine):
    srv = start_server(build_app(engine, cors=None))
    try:
        r = httpx.get(srv.base_url + "/v1/models", headers={"Origin": PAGE})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers
    finally:
        srv.stop()


def test_root_path_names_the_proxy_prefix(engine):
    """Behind a proxy that serves the API under /llm and strips that prefix (uvicorn's
    --root-path): requests arrive at /v1/..., and the OpenAPI document names /llm so its
    links work from outside."""
    srv = start_server(build_app(engine), root_path="/llm")
    try:
        with openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0) as client:
            out = client.completions.create(model=MODEL, prompt="hi", max_tokens=2,
                                            extra_body={"ignore_eos": True})
            assert out.usage.completion_tokens == 2
        spec = httpx.get(srv.base_url + "/openapi.json").json()
        assert spec["servers"] == [{"url": "/llm"}]
    finally:
        srv.stop()


def test_cors_flags_parse_as_json_lists():
    cors = cors_from_args(_serve_args("--allowed-origins", f'["{PAGE}"]', "--allowed-methods",
                                      '["GET", "POST"]', "--allow-credentials"))
    assert cors == CorsOptions(allowed_origins=(PAGE,), allowed_methods=("GET", "POST"),
                               allow_credentials=True)
    assert cors_from_args(_serve_args()) == CorsOptions()


def test_a_bad_cors_list_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        _serve_args("--allowed-origins", PAGE)  # not JSON
    assert "--allowed-origins takes a JSON list" in capsys.readouterr().err


def test_tls_flags_are_checked_before_the_engine_loads(tmp_path):
    key = tmp_path / "k.pem"
    key.write_text("x")
    with pytest.raises(ConfigError, match="go together"):
        tls_from_args(_serve_args("--ssl-keyfile", str(key)))
    with pytest.raises(ConfigError, match="no such file"):
        tls_from_args(_serve_args("--ssl-keyfile", str(key), "--ssl-certfile", str(tmp_path / "none.pem")))
    with pytest.raises(ConfigError, match="need --ssl-keyfile"):
        tls_from_args(_serve_args("--ssl-cert-reqs", "2"))
    assert tls_from_args(_serve_args()).uvicorn_kwargs() == {}


def _self_signed(tmp: Path) -> tuple[Path, Path]:
    key, cert = tmp / "key.pem", tmp / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return key, cert


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command for a test certificate")
def test_https_with_the_given_certificate(engine, tmp_path):
    key, cert = _self_signed(tmp_path)
    srv = start_server(build_app(engine), tls=TLSOptions(keyfile=key, certfile=cert))
    try:
        url = f"https://127.0.0.1:{srv.port}"
        assert httpx.get(url + "/health", verify=ssl.create_default_context(cafile=str(cert))).status_code == 200
        with pytest.raises(httpx.ConnectError):  # an unknown certificate is not trusted
            httpx.get(url + "/health")
    finally:
        srv.stop()


def test_root_path_is_a_path():
    assert root_path_from_args(_serve_args("--root-path", "/llm/")) == "/llm"
    with pytest.raises(ConfigError, match="must start with '/'"):
        root_path_from_args(_serve_args("--root-path", "llm"))
