"""vLLM's --max-logprobs: the top logprobs a request may ask for, 20 unless the server says."""

from __future__ import annotations

import httpx
import pytest

from kvtier.engine.args import EngineArgs
from kvtier.engine.llm_engine import LLMEngine
from kvtier.sampling_params import InvalidRequestError, SamplingParams
from kvtier.server.app import build_app
from tests.server.conftest import ENGINE_OPTIONS, MODEL, make_engine, serve_until_clean
from tests.server.test_errors import assert_error


def _post(srv, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.base_url + path, json={"model": MODEL, "max_tokens": 2, **body}, timeout=60)


def test_twenty_by_default_and_more_when_the_server_allows(tiny_model_dir):
    for srv in serve_until_clean(build_app(make_engine(tiny_model_dir))):
        assert_error(_post(srv, "/v1/completions", {"prompt": "hi", "logprobs": 21}), 400, "logprobs")
        chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True}
        assert_error(_post(srv, "/v1/chat/completions", {**chat, "top_logprobs": 21}), 400, "top_logprobs")
        assert_error(_post(srv, "/v1/completions", {"prompt": "hi", "logprobs": 21, "echo": True}), 400,
                     "logprobs")
        assert _post(srv, "/v1/completions", {"prompt": "hi", "logprobs": 20}).status_code == 200
    for srv in serve_until_clean(build_app(make_engine(tiny_model_dir, max_logprobs=30))):
        out = _post(srv, "/v1/completions", {"prompt": "hi", "logprobs": 25}).json()
        # keyed by text: the sampled token may join, tokens of one text may merge
        assert all(20 < len(top) <= 26 for top in out["choices"][0]["logprobs"]["top_logprobs"])
        chat = {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 30}
        got = _post(srv, "/v1/chat/completions", chat).json()["choices"][0]["logprobs"]["content"]
        assert all(len(t["top_logprobs"]) == 30 for t in got)


def test_the_engine_checks_the_bound_and_minus_one_is_the_vocabulary(tiny_model_dir):
    engine = LLMEngine.from_engine_args(EngineArgs(model=tiny_model_dir, **ENGINE_OPTIONS))
    for field in ("logprobs", "prompt_logprobs"):
        with pytest.raises(InvalidRequestError, match="max_logprobs 20"):
            engine.add_request("a", [1, 2], SamplingParams(max_tokens=1, **{field: 21}))
    assert not engine.has_unfinished_requests()
    whole = LLMEngine.from_engine_args(EngineArgs(model=tiny_model_dir, max_logprobs=-1, **ENGINE_OPTIONS))
    assert whole.config.logprobs_limit == 2048
    whole.add_request("b", [1, 2], SamplingParams(max_tokens=1, logprobs=2048))
    while whole.has_unfinished_requests():
        outs = whole.step()
    assert len(outs[0].outputs[0].logprobs[0]) >= 2048
