"""The server samples with the model's generation_config.json where a request is silent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, make_engine, serve_until_clean


def test_the_models_max_new_tokens_caps_a_request_that_sets_none(tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text((Path(tiny_model_dir) / "config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({"max_new_tokens": 3, "temperature": 0.0}))
    for srv in serve_until_clean(build_app(make_engine(str(model)))):
        body = {"model": MODEL, "prompt": "hello", "ignore_eos": True}
        silent = httpx.post(srv.base_url + "/v1/completions", json=body, timeout=60).json()
        assert silent["usage"]["completion_tokens"] == 3
        fewer = httpx.post(srv.base_url + "/v1/completions", json={**body, "max_tokens": 2}, timeout=60)
        assert fewer.json()["usage"]["completion_tokens"] == 2
        chat = httpx.post(srv.base_url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": [{"role": "user", "content": "hi"}], "ignore_eos": True,
            "max_completion_tokens": 50})
        assert chat.json()["usage"]["completion_tokens"] == 3
