"""SGLang's native /generate: the shapes SGLang clients read (sglang.bench_serving's
native backend among them), the same tokens as /v1/completions, streamed text cumulative."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from kvtier.server.app import build_app
from tests.server.conftest import MODEL, make_engine, serve_until_clean

TEXT = "The quick brown fox"


@pytest.fixture(scope="module", params=[False, True], ids=["sync", "async"])
def live(request, tiny_model_dir):
    yield from serve_until_clean(build_app(make_engine(tiny_model_dir,
                                                       async_scheduling=request.param)))


@pytest.fixture(scope="module")
def http(live):
    with httpx.Client(base_url=live.base_url, timeout=60) as c:
        yield c


def generate(http, **body):
    resp = http.post("/generate", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}


def test_one_prompt_and_its_meta_info(live, http):
    out = generate(http, text=TEXT, sampling_params=GREEDY)
    meta = out["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["prompt_tokens"] == len(live.engine.tokenizer.encode(TEXT))
    assert meta["completion_tokens"] == len(out["output_ids"]) == 8
    assert meta["e2e_latency"] > 0 and meta["id"]
    assert out["text"] == live.engine.tokenizer.decode(out["output_ids"])
    same = http.post("/v1/completions", json={"model": MODEL, "prompt": TEXT, "max_tokens": 8,
                                              "temperature": 0, "ignore_eos": True}).json()
    assert same["choices"][0]["text"] == out["text"]


def test_batches_token_ids_and_n(live, http):
    ids = live.engine.tokenizer.encode(TEXT)
    one = generate(http, input_ids=ids, sampling_params=GREEDY)
    assert isinstance(one, dict)
    batch = generate(http, text=[TEXT, "Hello"], sampling_params=GREEDY)
    assert isinstance(batch, list) and len(batch) == 2 and batch[0]["text"] == one["text"]
    id_batch = generate(http, input_ids=[ids, ids], sampling_params=GREEDY)
    assert [b["output_ids"] for b in id_batch] == [one["output_ids"]] * 2
    several = generate(http, text=TEXT, sampling_params={**GREEDY, "n": 3, "temperature": 1.0})
    assert len(several) == 3 and len({s["meta_info"]["id"] for s in several}) == 3


def test_stream_is_cumulative_and_ends_with_done(http):
    whole = generate(http, text=TEXT, sampling_params=GREEDY)
    events = []
    with http.stream("POST", "/generate", json={"text": TEXT, "sampling_params": GREEDY,
                                                "stream": True}) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(line[len("data: "):])
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))  # each the text so far
    assert texts[-1] == whole["text"]
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and counts[-1] == 8
    assert chunks[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


def test_formats_and_stops(http):
    held = generate(http, text=TEXT, sampling_params={"regex": "[0-9]{3}", "max_new_tokens": 20})
    assert re.fullmatch("[0-9]{3}", held["text"])
    assert held["meta_info"]["finish_reason"]["type"] == "stop"
    free = generate(http, text=TEXT, sampling_params=GREEDY)["text"]
    stop = free[2:5]
    cut = generate(http, text=TEXT, sampling_params={**GREEDY, "stop": stop})
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert stop not in cut["text"]


@pytest.mark.parametrize("body", [
    {"text": TEXT, "input_ids": [1, 2]}, {},
    {"text": TEXT, "return_logprob": True, "logprob_start_len": 0},  # input logprobs
    {"text": TEXT, "return_logprob": True, "top_logprobs_num": 10_000},  # over --max-logprobs
    {"text": TEXT, "sampling_params": {"max_new_tokens": 0}},
    {"text": TEXT, "sampling_params": {"top_p": 0}},
    {"text": TEXT, "sampling_params": {"regex": "(unclosed"}},
])
def test_bad_requests_are_400(http, body):
    resp = http.post("/generate", json=body)
    assert resp.status_code == 400, resp.text
    assert resp.json()["error"]["message"]


def test_a_bad_value_names_sglangs_field(http):
    resp = http.post("/generate", json={"text": TEXT, "sampling_params": {"max_new_tokens": 0}})
    assert resp.json()["error"]["param"] == "sampling_params.max_new_tokens"


def test_return_logprob_matches_the_completions_logprobs(live, http):
    """SGLang's output logprobs: [logprob, id, text] a token, the top k a position, the same
    values the completions endpoint gives for the same greedy tokens."""
    out = generate(http, text=TEXT, return_logprob=True, top_logprobs_num=3,
                   return_text_in_logprobs=True, sampling_params=GREEDY)
    meta = out["meta_info"]
    chosen, top = meta["output_token_logprobs"], meta["output_top_logprobs"]
    assert [c[1] for c in chosen] == out["output_ids"] and len(top) == 8
    assert meta["input_token_logprobs"] == []
    same = http.post("/v1/completions", json={"model": MODEL, "prompt": TEXT, "max_tokens": 8,
                                              "temperature": 0, "ignore_eos": True,
                                              "logprobs": 3}).json()["choices"][0]["logprobs"]
    assert [c[0] for c in chosen] == pytest.approx(same["token_logprobs"])
    assert [c[2] for c in chosen] == same["tokens"]
    for position, want in zip(top, same["top_logprobs"]):
        assert len(position) == 3 and [e[0] for e in position] == sorted(
            (e[0] for e in position), reverse=True)
        assert {e[2]: e[0] for e in position} == pytest.approx(want)
    plain = generate(http, text=TEXT, return_logprob=True, sampling_params=GREEDY)["meta_info"]
    assert plain["output_top_logprobs"] == [] and all(c[2] is None
                                                      for c in plain["output_token_logprobs"])
