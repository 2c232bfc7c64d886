"""The server samples with the model's generation_config.json where a request is silent."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from kvtier.config import GenerationDefaults
from kvtier.server.api_models import CompletionRequest
from kvtier.server.app import build_app
from kvtier.server.params import ServingLimits, sampling_params
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


def test_requests_keep_what_they_set():
    defaults = GenerationDefaults(sampling=(("max_tokens", 16), ("repetition_penalty", 1.1),
                                            ("temperature", 0.6), ("top_k", 20)))
    limits = ServingLimits(max_model_len=128, vocab_size=2048, max_num_seqs=8, max_seqs_per_request=8)
    unset = sampling_params(CompletionRequest(prompt="x"), None, None, limits, defaults=defaults)
    assert (unset.temperature, unset.top_k, unset.repetition_penalty, unset.max_tokens) == (0.6, 20, 1.1, 16)
    assert (unset.top_p, unset.min_p) == (1.0, 0.0)  # the file is silent: kvtier's defaults
    req = CompletionRequest(prompt="x", temperature=0.0, top_k=-1, repetition_penalty=1.0)
    given = sampling_params(req, 100, None, limits, defaults=defaults)
    assert (given.temperature, given.top_k, given.repetition_penalty) == (0.0, -1, 1.0)
    assert given.max_tokens == 16  # the model's max_new_tokens caps it, as vLLM's does
    assert sampling_params(req, 4, None, limits, defaults=defaults).max_tokens == 4
